package metrics_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/shoalfabric/shoal/cmd/shoal/internal/metrics"
)

// A loopback listener answers loopback names only: a page of another
// site whose name resolves to 127.0.0.1 (DNS rebinding) reaches it with
// that name as the Host, and could read the metrics from a browser on
// the machine.
func TestMetricsOnLoopbackRefuseOtherHosts(t *testing.T) {
	url, serve, err := metrics.New().Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- serve(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	for host, want := range map[string]int{"": http.StatusOK, "localhost:9": http.StatusOK, "[::1]:9": http.StatusOK, "rebind.example:9": http.StatusForbidden, "10.0.0.1": http.StatusForbidden} {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
		if host != "" {
			req.Host = host
		}
		rep, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		rep.Body.Close()
		if rep.StatusCode != want {
			t.Errorf("Host %q: %d, want %d", host, rep.StatusCode, want)
		}
	}
}
