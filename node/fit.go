package node

import (
	"encoding/json"
	"fmt"

	"github.com/shoalfabric/shoal/schemas"
)

// fit returns the envelope of ev in at most limit bytes. An event that is
// too big (a huge tool output, a large image) is cut down rather than
// dropped: images and binary blobs give way to a text marker first, then
// the longest strings are truncated with a marker saying how much is gone.
// The node's own event log keeps the whole event.
func fit(env []byte, limit int) ([]byte, error) {
	if len(env) <= limit {
		return env, nil
	}
	var tree any
	if err := json.Unmarshal(env, &tree); err != nil {
		return nil, err
	}
	for range 64 {
		over := len(env) - limit
		if over <= 0 {
			break
		}
		if !dropLargestBinary(tree, over) && !truncateLongest(tree, over+256) {
			return nil, fmt.Errorf("event of %d bytes cannot be cut below %d", len(env), limit)
		}
		b, err := json.Marshal(tree)
		if err != nil {
			return nil, err
		}
		env = b
	}
	if len(env) > limit {
		return nil, fmt.Errorf("event still %d bytes after cutting", len(env))
	}
	if _, err := schemas.Decode(env); err != nil {
		return nil, fmt.Errorf("cut event is invalid: %w", err)
	}
	return env, nil
}

// dropLargestBinary replaces the largest image, audio or blob content
// block bigger than over/2 with a text marker.
func dropLargestBinary(tree any, over int) bool {
	var best map[string]any
	bestSize := 0
	walk(tree, func(m map[string]any) {
		size := 0
		switch m["type"] {
		case "image", "audio":
			s, _ := m["data"].(string)
			size = len(s)
		case "resource":
			s, _ := m["blob"].(string)
			size = len(s)
		}
		if size > bestSize {
			best, bestSize = m, size
		}
	})
	if best == nil || bestSize < over/2 {
		return false
	}
	mime, _ := best["mimeType"].(string)
	kind, _ := best["type"].(string)
	for k := range best {
		delete(best, k)
	}
	best["type"] = "text"
	best["text"] = fmt.Sprintf("[%s %s of %d base64 bytes omitted by shoal: the event exceeded the message size limit]", kind, mime, bestSize)
	return true
}

// truncateLongest cuts the longest string by at least cut bytes.
func truncateLongest(tree any, cut int) bool {
	var parent any
	var key any
	longest := 0
	visit := func(p any, k any, s string) {
		if len(s) > longest {
			parent, key, longest = p, k, len(s)
		}
	}
	walkStrings(tree, visit)
	if parent == nil || longest < 64 {
		return false
	}
	s := get(parent, key)
	keep := max(0, len(s)-cut-128)
	for keep > 0 && keep < len(s) && s[keep]&0xC0 == 0x80 {
		keep-- // do not split a UTF-8 sequence
	}
	set(parent, key, s[:keep]+schemas.TruncationMarker(len(s)-keep))
	return true
}

func walk(v any, fn func(map[string]any)) {
	switch x := v.(type) {
	case map[string]any:
		fn(x)
		for _, c := range x {
			walk(c, fn)
		}
	case []any:
		for _, c := range x {
			walk(c, fn)
		}
	}
}

func walkStrings(v any, fn func(parent, key any, s string)) {
	switch x := v.(type) {
	case map[string]any:
		for k, c := range x {
			if s, ok := c.(string); ok {
				if k != "kind" && k != "type" {
					fn(x, k, s)
				}
				continue
			}
			walkStrings(c, fn)
		}
	case []any:
		for i, c := range x {
			if s, ok := c.(string); ok {
				fn(x, i, s)
				continue
			}
			walkStrings(c, fn)
		}
	}
}

func get(parent, key any) string {
	switch p := parent.(type) {
	case map[string]any:
		s, _ := p[key.(string)].(string)
		return s
	case []any:
		s, _ := p[key.(int)].(string)
		return s
	}
	return ""
}

func set(parent, key any, s string) {
	switch p := parent.(type) {
	case map[string]any:
		p[key.(string)] = s
	case []any:
		p[key.(int)] = s
	}
}
