package main

import (
	"strings"
	"testing"
)

// shoal up --bus tcp://0.0.0.0:… on a fabric without --auth is refused
// (rightly), but the one line says "and this fabric requires credentials"
// (which is false without --auth and sent a new user looking for
// credentials they never set). The reason holds for every fabric.
func TestBusRefusalSaysWhyWithoutAuth(t *testing.T) {
	t.Parallel()
	code, _, errOut := runShoal(t, t.TempDir(), nil, "up", "--port", "-1", "--mcp-listen", "127.0.0.1:0", "--bus", "tcp://0.0.0.0:0", "--no-node")
	if code != 2 || !strings.Contains(errOut, "refusing to publish the Kaimon bus") {
		t.Fatalf("exit %d, %q; want exit 2 refusing the bus", code, errOut)
	}
	if strings.Contains(errOut, "this fabric requires credentials") {
		t.Errorf("a fabric without --auth is told it requires credentials: %q", errOut)
	}
}
