package schemas

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// AgentToken is the bearer token one life of an agent presents at the
// coordinator's MCP endpoint when the endpoint has a token: derived from
// the endpoint's token, the agent's id and the request id of the open that
// began this life. It names that agent only, and only while that life's
// record stands; the endpoint's own token is never handed to an agent.
func AgentToken(endpointToken, agent, openRequestID string) string {
	mac := hmac.New(sha256.New, []byte("shoal agent token\x00"+endpointToken))
	mac.Write([]byte(agent + "\x00" + openRequestID))
	return agentTokenPrefix + hex.EncodeToString(mac.Sum(nil))
}

// agentTokenPrefix begins every agent's token.
const agentTokenPrefix = "agent-"

// IsAgentToken reports whether a bearer token has the form of an agent's
// own (AgentToken): it names an agent, never a person.
func IsAgentToken(token string) bool { return strings.HasPrefix(token, agentTokenPrefix) }
