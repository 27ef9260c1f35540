package openai

import (
	"context"
	"strings"

	"github.com/shoalfabric/shoal/node/backend"
)

// DefaultVMLXHost is where an MLX server listens unless VMLX_HOST says
// otherwise.
const DefaultVMLXHost = "http://127.0.0.1:8000"

// Host normalises a VMLX_HOST value into a base URL; "" gives
// DefaultVMLXHost.
func Host(v string) string {
	v = strings.TrimSpace(v)
	if v == "" {
		return DefaultVMLXHost
	}
	if !strings.Contains(v, "://") {
		v = "http://" + v
	}
	return strings.TrimSuffix(strings.TrimRight(v, "/"), "/v1")
}

// Models lists the models the server at host offers (GET /v1/models).
func Models(ctx context.Context, host string) ([]string, error) {
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := backend.FetchJSON(ctx, host+"/v1/models", &list); err != nil {
		return nil, err
	}
	out := []string{}
	for _, m := range list.Data {
		out = append(out, m.ID)
	}
	return out, nil
}
