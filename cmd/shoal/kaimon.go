package main

import (
	"encoding/json"
	"errors"
	"flag"
	"math"
	"os"
	"path/filepath"
	"strconv"
)

// Kaimon keeps the long-edge limit of tool-result images in its own
// config, as agent_image_max_long_edge in $XDG_CONFIG_HOME/kaimon/config.json:
// an integer or a real (rounded), 0 or less for no downsampling. Shoal
// reads it there for --image-max-long-edge when none of its own sources
// (the command line, SHOAL_IMAGE_MAX_LONG_EDGE, its config file) sets the
// flag, once, as the node starts.
const (
	imageEdgeFlag = "image-max-long-edge"
	kaimonKey     = "agent_image_max_long_edge"
)

// kaimonConfig is where Kaimon keeps its config.
func kaimonConfig(getenv func(string) string) string {
	return filepath.Join(configHome(getenv), "kaimon", "config.json")
}

// applyKaimon sets the image limit from Kaimon's config, when fs has the
// flag, nothing of Shoal's set it, and Kaimon's config has the key.
func applyKaimon(fs *flag.FlagSet, getenv func(string) string, from map[string]string) error {
	if fs.Lookup(imageEdgeFlag) == nil || from[imageEdgeFlag] != "" {
		return nil
	}
	path := kaimonConfig(getenv)
	edge, ok, err := readKaimonImageEdge(path)
	if err != nil || !ok {
		return err
	}
	if err := fs.Set(imageEdgeFlag, strconv.Itoa(edge)); err != nil {
		return usagef("Kaimon config %s: %s: %v", path, kaimonKey, err)
	}
	from[imageEdgeFlag] = "Kaimon config " + path
	return nil
}

// readKaimonImageEdge reads agent_image_max_long_edge from Kaimon's
// config: ok is false when the file or the key is not there. A value of 0
// or less is 0, Shoal's "never".
func readKaimonImageEdge(path string) (edge int, ok bool, err error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, usagef("Kaimon config %s: %v (it is read for %s; give --%s to not depend on it)", path, pathless(err), kaimonKey, imageEdgeFlag)
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return 0, false, usagef("Kaimon config %s is not a JSON object: %v (it is read for %s; give --%s to not depend on it)", path, err, kaimonKey, imageEdgeFlag)
	}
	v, ok := cfg[kaimonKey]
	if !ok || string(v) == "null" {
		return 0, false, nil
	}
	var n float64
	if err := json.Unmarshal(v, &n); err != nil || math.IsNaN(n) || math.Abs(n) > 1<<30 {
		return 0, false, usagef("Kaimon config %s: %s is %s, not a number of pixels", path, kaimonKey, v)
	}
	return max(0, int(math.Round(n))), true, nil
}
