package proc

import (
	"crypto/rand"
	"encoding/hex"
)

// newToken is 16 random hex characters.
func newToken() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// NewLifeToken is a token for one life of an agent (see LifeEnv).
func NewLifeToken() string { return newToken() }
