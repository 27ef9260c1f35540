package peers

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// Env is an environment for running a peer offline: only what is listed
// here reaches the CLI, never the caller's own credentials or config.
type Env []string

// baseEnv has a private HOME and XDG dirs under home, and PATH.
func baseEnv(home string) Env {
	return Env{
		"HOME=" + home,
		"XDG_CONFIG_HOME=" + filepath.Join(home, ".config"),
		"XDG_DATA_HOME=" + filepath.Join(home, ".local", "share"),
		"XDG_CACHE_HOME=" + filepath.Join(home, ".cache"),
		"XDG_STATE_HOME=" + filepath.Join(home, ".local", "state"),
		"PATH=" + os.Getenv("PATH"),
		"LANG=C.UTF-8",
	}
}

// ClaudeEnv runs Claude Code (and claude-agent-acp) against an Anthropic
// Messages API at baseURL with a throwaway key and no side traffic.
func ClaudeEnv(home, baseURL string) Env {
	return append(baseEnv(home),
		"ANTHROPIC_BASE_URL="+baseURL,
		"ANTHROPIC_API_KEY=sk-test",
		"DISABLE_TELEMETRY=1",
		"DISABLE_AUTOUPDATER=1",
		"DISABLE_ERROR_REPORTING=1",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
		"CLAUDE_CODE_MAX_RETRIES=0",
		"IS_SANDBOX=1", // bypassPermissions is refused as root without it
	)
}

// OpencodeEnv runs opencode against an OpenAI-compatible server at
// baseURL (…/v1), with a config naming the fake model "fake/fake-model".
func OpencodeEnv(tb testing.TB, home, baseURL string) Env {
	tb.Helper()
	config := map[string]any{
		"$schema": "https://opencode.ai/config.json",
		"provider": map[string]any{"fake": map[string]any{
			"npm": "@ai-sdk/openai-compatible", "name": "Fake local",
			"options": map[string]any{"baseURL": baseURL, "apiKey": "sk-test"},
			"models": map[string]any{"fake-model": map[string]any{
				"name": "Fake Model", "tool_call": true, "reasoning": false,
				"limit": map[string]any{"context": 128000, "output": 4096}}},
		}},
		"model": "fake/fake-model", "small_model": "fake/fake-model",
		"autoupdate": false, "share": "disabled",
	}
	writeJSON(tb, filepath.Join(home, ".config", "opencode", "opencode.json"), config)
	// Without these opencode fetches its plugin package from the npm
	// registry at every start (see the ACP backend's opencodeConfig).
	writeJSON(tb, filepath.Join(home, ".config", "opencode", "package-lock.json"),
		map[string]any{"packages": map[string]any{"": map[string]any{"dependencies": map[string]string{"@opencode-ai/plugin": "*"}}}})
	if err := os.MkdirAll(filepath.Join(home, ".config", "opencode", "node_modules"), 0o755); err != nil {
		tb.Fatal(err)
	}
	return append(baseEnv(home),
		"OPENCODE_DISABLE_MODELS_FETCH=1", "OPENCODE_DISABLE_AUTOUPDATE=1", "OPENCODE_PURE=1",
		"OPENCODE_DISABLE_DEFAULT_PLUGINS=1", "OPENCODE_DISABLE_LSP_DOWNLOAD=1", "OPENCODE_DISABLE_SHARE=1",
		"OPENCODE_DISABLE_CLAUDE_CODE=1", "OPENCODE_DISABLE_EXTERNAL_SKILLS=1",
	)
}

// GeminiEnv runs gemini-cli against a Gemini API at baseURL with an API
// key, which needs the auth type in its settings.
func GeminiEnv(tb testing.TB, home, baseURL string) Env {
	tb.Helper()
	writeJSON(tb, filepath.Join(home, ".gemini", "settings.json"), map[string]any{
		"security": map[string]any{"auth": map[string]any{"selectedType": "gemini-api-key"}},
		"privacy":  map[string]any{"usageStatisticsEnabled": false},
		"general":  map[string]any{"disableAutoUpdate": true, "disableUpdateNag": true},
	})
	return append(baseEnv(home),
		"GEMINI_API_KEY=test-key",
		"GOOGLE_GEMINI_BASE_URL="+baseURL,
		"GEMINI_CLI_TRUST_WORKSPACE=true",
	)
}

func writeJSON(tb testing.TB, path string, v any) {
	tb.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		tb.Fatal(err)
	}
}
