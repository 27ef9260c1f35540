package web_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/shoalfabric/shoal/internal/natstest"
)

// The dashboard's tests open agents on repositories, whose bundles go
// through the object store: its Put may leave the NATS client's known
// leak (natstest.KnownLeaks).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, natstest.KnownLeaks...) }
