package main

import (
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/schemas"
)

// The same work fetched again is the same commit, stored once: each fetch
// committed the uncommitted work anew (a new date, so a new tip) and
// stored a whole new bundle of it, kept 24 hours and counted against
// --repos-max-bytes: four fetches of a 2 GiB work filled the default
// store, and every open on any repository was refused for a day.
func TestFetchingTheSameWorkAgainStoresItOnce(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, nil)
	repo := oneCommitRepo(t, "repo", "hello\n")
	c.must("open", "--repo", repo, "--id", "w", "--permission", "bypass")
	in, _ := json.Marshal(map[string]string{"command": "head -c 4000000 /dev/urandom > big.bin", "description": "write"})
	c.fake.Script(fakemodel.Reply{ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: in}}}, fakemodel.Reply{Text: "Written."})
	c.must("run", "w", "Write big.bin.")
	stored := func() uint64 {
		t.Helper()
		nc, err := nats.Connect(c.url)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		s, err := js.Stream(t.Context(), "OBJ_"+schemas.ReposBucket)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Bytes
	}
	c.must("fetch", "w")
	once, first := stored(), gitIn(t, repo, "rev-parse", "shoal/w")
	for range 3 {
		c.must("fetch", "w")
	}
	if got := stored(); got > once+(64<<10) {
		t.Errorf("the repositories' store holds %d bytes after four fetches of the same work, %d after the first", got, once)
	}
	if tip := gitIn(t, repo, "rev-parse", "shoal/w"); tip != first {
		t.Errorf("shoal/w moved from %s to %s, the same work fetched again", first, tip)
	}
}
