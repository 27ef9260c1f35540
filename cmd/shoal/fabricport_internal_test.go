package main

import "testing"

// A nats given as host:port, with no scheme, as clients take it, names
// its port to the check that port and nats from one place agree: the same
// port stands, another is refused (an outside reader found it the other
// way round).
func TestOneFabricPortReadsHostPort(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		port, nats string
		ok         bool
	}{
		{"4333", "127.0.0.1:4333", true},
		{"4333", "localhost:4333", true},
		{"4222", "localhost:9999", false},
		{"4333", "nats://127.0.0.1:4333", true},
	} {
		setting := func(name string) (string, string) {
			switch name {
			case "port":
				return c.port, "env SHOAL_PORT"
			case "nats":
				return c.nats, "env SHOAL_NATS"
			}
			return "", ""
		}
		err := oneFabricPort(setting)
		if (err == nil) != c.ok {
			t.Errorf("SHOAL_PORT=%s SHOAL_NATS=%s: got %v, want ok=%v", c.port, c.nats, err, c.ok)
		}
	}
}
