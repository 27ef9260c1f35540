package openai

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
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
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, host+"/v1/models", nil)
	if err != nil {
		return nil, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s/v1/models: %s", host, res.Status)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(res.Body).Decode(&list); err != nil {
		return nil, fmt.Errorf("%s/v1/models: %w", host, err)
	}
	out := []string{}
	for _, m := range list.Data {
		out = append(out, m.ID)
	}
	return out, nil
}
