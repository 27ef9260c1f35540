package tui

import (
	"testing"

	"go.uber.org/goleak"
)

// The follower must end with the monitor's context.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
