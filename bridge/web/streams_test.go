package web_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/bridge/web"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// Each event stream the dashboard serves holds a JetStream consumer, and
// the agents' stream has at most 1,000 for everyone: the observer's token
// opened a thousand streams and every read of the fabric failed after
// ("maximum consumers limit reached"), a person's page and agent_output
// among them. One role's streams are bounded, a stream past the bound is
// refused naming it, and the other role's and everyone's reads go on.
func TestDashboardBoundsEachRolesStreams(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	nc, js := natstest.JetStream(t, b)
	f, err := client.NewDirect(nc, client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	env, err := schemas.Encode(schemas.Event{Turn: 1, Payload: schemas.AssistantText{Content: schemas.Text("hello")}})
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(schemas.EventSubject("watched"))
	m.Data = env
	m.Header.Set(schemas.HeaderMsgID, schemas.MsgID("watched", 1))
	if _, err := js.PublishMsg(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(web.New(web.Config{Client: f, Token: "full", ObserverToken: "watcher"}))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	stream := func(token, query string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/api/agents/watched/events"+query, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		return hc.Do(req)
	}
	var held []*http.Response
	defer func() {
		cancel()
		for _, r := range held {
			r.Body.Close()
		}
	}()
	n := 0
	for ; n < 1100; n++ {
		rep, err := stream("watcher", "")
		if err != nil {
			t.Fatal(err)
		}
		if rep.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(rep.Body)
			rep.Body.Close()
			if rep.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "event streams are open under these credentials") {
				t.Fatalf("the observer's stream %d: %d %s", n+1, rep.StatusCode, b)
			}
			t.Logf("the observer's stream %d: %d %s", n+1, rep.StatusCode, strings.TrimSpace(string(b)))
			break
		}
		// The stream is served (its first line is its retry hint) and
		// kept open, following.
		if _, err := bufio.NewReader(rep.Body).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		held = append(held, rep)
	}
	if n != web.StreamsPerRole {
		t.Errorf("the observer's token holds %d streams at once; want %d", n, web.StreamsPerRole)
	}
	// The full token's page reads the agent to its end.
	rep, err := stream("full", "?follow=0")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(rep.Body)
	rep.Body.Close()
	if rep.StatusCode != http.StatusOK || !strings.Contains(string(body), "event: end") || !strings.Contains(string(body), "hello") {
		t.Errorf("the person's stream while the observer holds its bound: %d %s", rep.StatusCode, body)
	}
	// And any other reader of the stream.
	got := 0
	if err := f.Replay(t.Context(), []string{"watched"}, client.From{}, false, func(client.Replayed, *client.Gap) error { got++; return nil }); err != nil || got != 1 {
		t.Errorf("a replay while the observer holds its bound: %d events, %v", got, err)
	}
	// A stream that ends frees its place.
	held[0].Body.Close()
	held = held[1:]
	for range 500 {
		time.Sleep(20 * time.Millisecond) // the server hears of the close
		rep, err := stream("watcher", "?follow=0")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, rep.Body)
		rep.Body.Close()
		if rep.StatusCode == http.StatusOK {
			return
		}
	}
	t.Error("a place freed by a closed stream was never given again")
}
