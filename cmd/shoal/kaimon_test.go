package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The image limit comes from, in rising precedence: the default, Kaimon's
// agent_image_max_long_edge, Shoal's config file, SHOAL_IMAGE_MAX_LONG_EDGE,
// the flag. Kaimon's config is at $XDG_CONFIG_HOME/kaimon/config.json,
// else ~/.config/kaimon/config.json.
func TestImageSettingFromKaimon(t *testing.T) {
	t.Parallel()
	type setup struct {
		xdg     bool   // XDG_CONFIG_HOME is set
		kaimon  string // Kaimon's config.json, if any
		shoal   string // Shoal's config.toml, if any
		env     string // SHOAL_IMAGE_MAX_LONG_EDGE
		args    []string
		want    string
		from    string // where it came from: "", "kaimon", "shoal", "env" or "flag"
		wantErr string
	}
	for _, c := range []setup{
		{xdg: true, want: "1568"},
		{xdg: true, kaimon: `{"theme": "dark"}`, want: "1568"},
		{xdg: true, kaimon: `{"agent_image_max_long_edge": 1024, "theme": "dark"}`, want: "1024", from: "kaimon"},
		{xdg: false, kaimon: `{"agent_image_max_long_edge": 1024}`, want: "1024", from: "kaimon"},
		{xdg: true, kaimon: `{"agent_image_max_long_edge": 800.6}`, want: "801", from: "kaimon"},
		{xdg: true, kaimon: `{"agent_image_max_long_edge": -5}`, want: "0", from: "kaimon"},
		{xdg: true, kaimon: `{"agent_image_max_long_edge": 1024}`, shoal: "image-max-long-edge = 900", want: "900", from: "shoal"},
		{xdg: true, kaimon: `{"agent_image_max_long_edge": 1024}`, shoal: "image-max-long-edge = 900", env: "700", want: "700", from: "env"},
		{xdg: true, kaimon: `{"agent_image_max_long_edge": 1024}`, shoal: "image-max-long-edge = 900", env: "700",
			args: []string{"--image-max-long-edge", "600"}, want: "600", from: "flag"},
		{xdg: true, kaimon: `{"agent_image_max_long_edge": "big"}`, wantErr: `agent_image_max_long_edge is "big", not a number of pixels`},
		{xdg: true, kaimon: `{not json`, wantErr: "is not a JSON object"},
		// Shoal's own setting wins without reading Kaimon's config at all.
		{xdg: true, kaimon: `{not json`, args: []string{"--image-max-long-edge", "600"}, want: "600", from: "flag"},
	} {
		home := t.TempDir()
		env := map[string]string{"HOME": home, "SHOAL_IMAGE_MAX_LONG_EDGE": c.env}
		configHome := filepath.Join(home, ".config")
		if c.xdg {
			configHome = filepath.Join(home, "xdg")
			env["XDG_CONFIG_HOME"] = configHome
		}
		kaimon := filepath.Join(configHome, "kaimon", "config.json")
		shoal := filepath.Join(configHome, "shoal", "config.toml")
		for path, text := range map[string]string{kaimon: c.kaimon, shoal: c.shoal} {
			if text != "" {
				os.MkdirAll(filepath.Dir(path), 0o700)
				os.WriteFile(path, []byte(text), 0o600)
			}
		}
		wantFrom := map[string]string{"": "", "kaimon": "Kaimon config " + kaimon, "shoal": "config file " + shoal,
			"env": "env SHOAL_IMAGE_MAX_LONG_EDGE", "flag": "flag --image-max-long-edge"}[c.from]
		for _, cmd := range []*command{nodeCommand(), upCommand()} {
			fs, configPath, _ := cmd.flagSet()
			l, err := cmd.parseSettings(fs, c.args, configPath, func(k string) string { return env[k] })
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) || !strings.Contains(err.Error(), kaimon) {
					t.Errorf("shoal %s, %+v: err %v, want one naming %s and saying %q", cmd.name, c, err, kaimon, c.wantErr)
				}
				continue
			}
			if err != nil {
				t.Errorf("shoal %s, %+v: %v", cmd.name, c, err)
				continue
			}
			if got := fs.Lookup(imageEdgeFlag).Value.String(); got != c.want || l.from[imageEdgeFlag] != wantFrom {
				t.Errorf("shoal %s, %+v: %s from %q, want %s from %q", cmd.name, c, got, l.from[imageEdgeFlag], c.want, wantFrom)
			}
		}
	}

	// shoal config says so.
	dir := t.TempDir()
	kaimon := filepath.Join(dir, "config", "kaimon", "config.json")
	os.MkdirAll(filepath.Dir(kaimon), 0o700)
	os.WriteFile(kaimon, []byte(`{"agent_image_max_long_edge": 1024}`), 0o600)
	if code, out, errOut := runShoal(t, dir, nil, "config", "node"); code != 0 || !strings.Contains(squeeze(out), "image-max-long-edge = 1024 # Kaimon config "+kaimon) {
		t.Errorf("shoal config node: exit %d %s\n%s", code, errOut, out)
	}
}
