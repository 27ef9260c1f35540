package client_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/shoalfabric/shoal/internal/natstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, natstest.KnownLeaks...) }
