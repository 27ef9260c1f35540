package web_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/shoalfabric/shoal/bridge/web"
	"github.com/shoalfabric/shoal/schemas"
)

// The dashboard is for people: a request that carries an agent's marks,
// its id header or a token of an agent's form, is refused on every page,
// the API and the event stream with 403 and the rule, whether the
// dashboard has tokens or, on loopback, none (where any other request may
// act). Nothing it asks reaches the fabric.
func TestAgentsAreRefusedTheDashboard(t *testing.T) {
	t.Parallel()
	for _, cfg := range []web.Config{{}, {Token: "full-secret", ObserverToken: "observer-secret"}} {
		d := startDash(t, cfg)
		marks := []map[string]string{
			{schemas.AgentIDHeader: "a1"},
			{schemas.AgentIDHeader: ""},
			{"Authorization": "Bearer " + schemas.AgentToken("full-secret", "a1", "r1")},
			{schemas.AgentIDHeader: "a1", "Authorization": "Bearer full-secret"}, // an agent that holds the token is still an agent
		}
		reqs := []struct{ method, path, body string }{
			{"GET", "/", ""},
			{"GET", "/agents/a1", ""},
			{"GET", "/api/whoami", ""},
			{"GET", "/api/fleet", ""},
			{"GET", "/api/agents/a1", ""},
			{"GET", "/api/agents/a1/events", ""},
			{"GET", "/api/agents/a1/diff", ""},
			{"POST", "/api/open", `{"cwd":"/","permission":"bypass","sandbox":false}`},
			{"POST", "/api/open", `{"cwd":"/","repo":true}`},
			{"POST", "/api/agents/a1/send", `{"text":"hi"}`},
			{"POST", "/api/agents/a1/close", `{}`},
		}
		for _, mark := range marks {
			for _, r := range reqs {
				req, _ := http.NewRequestWithContext(t.Context(), r.method, d.url+r.path, strings.NewReader(r.body))
				req.Header.Set("Content-Type", "application/json")
				for k, v := range mark {
					req.Header.Set(k, v)
				}
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "rule side-doors") {
					t.Errorf("tokens %v, %s %s with %v: %d %s, want 403 naming rule side-doors", cfg.Token != "", r.method, r.path, mark, res.StatusCode, body)
				}
			}
		}
		if recs, err := d.f.List(t.Context()); err != nil || len(recs) != 0 {
			t.Errorf("an agent's requests opened %d agents (%v)", len(recs), err)
		}
		// A person is answered as before.
		token := ""
		if cfg.Token != "" {
			token = "Bearer " + cfg.Token
		}
		req, _ := http.NewRequestWithContext(t.Context(), "GET", d.url+"/api/fleet", nil)
		if token != "" {
			req.Header.Set("Authorization", token)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Errorf("a person's GET /api/fleet: %d", res.StatusCode)
		}
	}
}

// An observer acting is refused by rule observer, in the rules' words.
func TestObserverActsAreRefusedByTheRule(t *testing.T) {
	t.Parallel()
	d := startDash(t, web.Config{Token: "full-secret", ObserverToken: "observer-secret"})
	req, _ := http.NewRequestWithContext(t.Context(), "POST", d.url+"/api/agents/a1/send", strings.NewReader(`{"text":"hi"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer observer-secret")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden || !strings.Contains(string(body), `"code":"forbidden"`) || !strings.Contains(string(body), "an observer may not send to agent a1: rule observer") {
		t.Errorf("an observer's send: %d %s", res.StatusCode, body)
	}
}
