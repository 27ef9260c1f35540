package bridge

import (
	"strings"
	"testing"
)

// The bodies every caller holds at once are bounded in all, and the
// observer's token with three agents' tokens (a node's key yields one for
// each agent placed on it) took all of it, each trickling two large
// bodies: the full token, the people's, was refused for as long as they
// kept it up. Lesser principals together leave one caller's share for the
// full token.
func TestBodiesKeepTheFullTokensShare(t *testing.T) {
	b := newBodies()
	lesser := []string{"observer", "agent:a1", "agent:a2", "agent:a3"}
	var refused int
	for _, who := range lesser {
		if err := b.take(who, bodiesPerCaller); err != nil {
			refused++
			if !strings.Contains(err.Error(), "kept for the full token") {
				t.Errorf("%s refused: %v; want the share kept for the full token named", who, err)
			}
		}
	}
	if refused == 0 {
		t.Errorf("the observer and three agents held %d bytes together, the endpoint's whole bound", b.total)
	}
	if err := b.take("full", maxMCPBody); err != nil {
		t.Errorf("the full token, while the others hold what they may: %v", err)
	}
	// Without a full token (no tokens at all) nothing is kept.
	b = newBodies()
	for i, who := range []string{"everyone", "agent:a1", "agent:a2", "agent:a3"} {
		if err := b.take(who, bodiesPerCaller); err != nil {
			t.Errorf("caller %d (%s) with no full token to keep room for: %v", i, who, err)
		}
	}
}
