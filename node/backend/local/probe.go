package local

import (
	"context"
	"strings"

	"github.com/shoalfabric/shoal/node/proc"
)

// DefaultOllamaHost is where Ollama listens unless OLLAMA_HOST says otherwise.
const DefaultOllamaHost = "http://127.0.0.1:11434"

// OllamaHost normalises an OLLAMA_HOST value ("0.0.0.0", "host:port", a URL)
// into a base URL; "" gives DefaultOllamaHost.
func OllamaHost(v string) string {
	v = strings.TrimSpace(v)
	if v == "" {
		return DefaultOllamaHost
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

// OllamaModels lists the model tags the server at host offers (GET /api/tags).
func OllamaModels(ctx context.Context, host string) ([]string, error) {
	var tags struct {
		Models []struct {
			Name  string `json:"name"`
			Model string `json:"model"`
		} `json:"models"`
	}
	if err := proc.FetchJSON(ctx, host+"/api/tags", &tags); err != nil {
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

// DefaultVMLXHost is where an MLX server listens unless VMLX_HOST says
// otherwise.
const DefaultVMLXHost = "http://127.0.0.1:8000"

// VMLXHost normalises a VMLX_HOST value into a base URL; "" gives
// DefaultVMLXHost.
func VMLXHost(v string) string {
	v = strings.TrimSpace(v)
	if v == "" {
		return DefaultVMLXHost
	}
	if !strings.Contains(v, "://") {
		v = "http://" + v
	}
	return strings.TrimSuffix(strings.TrimRight(v, "/"), "/v1")
}

// OpenAIModels lists the models the server at host offers (GET /v1/models).
func OpenAIModels(ctx context.Context, host string) ([]string, error) {
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := proc.FetchJSON(ctx, host+"/v1/models", &list); err != nil {
		return nil, err
	}
	out := []string{}
	for _, m := range list.Data {
		out = append(out, m.ID)
	}
	return out, nil
}
