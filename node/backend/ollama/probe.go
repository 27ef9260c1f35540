package ollama

import (
	"context"
	"strings"

	"github.com/shoalfabric/shoal/node/backend"
)

// DefaultHost is where Ollama listens unless OLLAMA_HOST says otherwise.
const DefaultHost = "http://127.0.0.1:11434"

// Host normalises an OLLAMA_HOST value ("0.0.0.0", "host:port", a URL)
// into a base URL; "" gives DefaultHost.
func Host(v string) string {
	v = strings.TrimSpace(v)
	if v == "" {
		return DefaultHost
	}
	if !strings.Contains(v, "://") {
		v = "http://" + v
	}
	if h, _, ok := strings.Cut(strings.SplitN(v, "://", 2)[1], "/"); ok || !strings.Contains(h, ":") {
		if !strings.Contains(h, ":") {
			v = strings.Replace(v, h, h+":11434", 1)
		}
	}
	return strings.TrimRight(v, "/")
}

// Models lists the model tags the server at host offers (GET /api/tags).
func Models(ctx context.Context, host string) ([]string, error) {
	var tags struct {
		Models []struct {
			Name  string `json:"name"`
			Model string `json:"model"`
		} `json:"models"`
	}
	if err := backend.FetchJSON(ctx, host+"/api/tags", &tags); err != nil {
		return nil, err
	}
	out := []string{}
	for _, m := range tags.Models {
		name := m.Name
		if name == "" {
			name = m.Model
		}
		out = append(out, name)
	}
	return out, nil
}
