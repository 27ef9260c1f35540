package web_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/shoalfabric/shoal/bridge/web"
	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/schemas"
)

// The observer token, in a real Chromium, sees the fleet, an agent's
// stream and its waiting permission request with the tool's input, but
// no control; every action answers 403 to it, from the page and with a
// bearer header, and nothing answers a request without a token.
func TestObserverSeesEverythingAndActsOnNothing(t *testing.T) {
	t.Parallel()
	const token, observer = "full-secret", "observer-secret"
	d := startDash(t, web.Config{Token: token, ObserverToken: observer})
	d.fake.Script(bashReply("echo watched"), fakemodel.Reply{Text: "Done."})
	if _, err := d.f.Open(t.Context(), schemas.OpenRequest{ID: "watched", CWD: t.TempDir(), Permission: "ask"}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.f.Send(t.Context(), schemas.SendRequest{AgentID: "watched", Text: "List the directory."}); err != nil {
		t.Fatal(err)
	}
	ctx := browser(t)
	do(t, ctx, chromedp.Navigate(d.url+"/?token="+observer))
	waitJS(t, ctx, "the observer sees the agent", `document.querySelector('#agents tr[data-agent="watched"]')`, 30*time.Second)
	if !eval[bool](t, ctx, `document.querySelector("#open-section").hidden && window.shoal.role === "observer"`) {
		t.Error("the observer is shown the open form")
	}
	do(t, ctx, chromedp.Navigate(d.url+"/agents/watched"))
	waitJS(t, ctx, "the observer sees the permission request", `document.querySelector(".permit pre.input")`, 60*time.Second)
	if in := eval[string](t, ctx, `document.querySelector(".permit pre.input").textContent`); !strings.Contains(in, "echo watched") {
		t.Errorf("the request's input: %q", in)
	}
	waitJS(t, ctx, "the observer sees the stream", `document.querySelector(".thought") && document.querySelector("details.tool")`, 30*time.Second)
	if visible := eval[int](t, ctx, `[...document.querySelectorAll("#controls, .permit button, #send-form")].filter(e => e.offsetParent !== null).length`); visible != 0 {
		t.Errorf("the observer is shown %d controls", visible)
	}
	all, err := d.f.Pending(t.Context())
	pending := all.Requests
	if err != nil || len(pending) != 1 {
		t.Fatalf("pending: %+v %v", pending, err)
	}
	req := pending[0].RequestID
	actions := map[string]string{
		"/api/open":                     `{"cwd":"/tmp"}`,
		"/api/agents/watched/send":      `{"text":"hi"}`,
		"/api/agents/watched/interrupt": `{}`,
		"/api/agents/watched/close":     `{}`,
		"/api/agents/watched/model":     `{"model":"opus"}`,
		"/api/agents/watched/permit":    `{"request_id":"` + req + `","decision":"allow"}`,
	}
	for path, body := range actions {
		if got := post(t, d.url+path, observer, body); got != http.StatusForbidden {
			t.Errorf("POST %s with the observer token: %d, want 403", path, got)
		}
		if got := post(t, d.url+path, "", body); got != http.StatusUnauthorized {
			t.Errorf("POST %s without a token: %d, want 401", path, got)
		}
		js := fmt.Sprintf(`fetch(%s, {method: "POST", headers: {"Content-Type": "application/json"}, body: %s}).then(r => r.status)`, jsString(path), jsString(body))
		if got := eval[int](t, ctx, js); got != http.StatusForbidden {
			t.Errorf("POST %s from the observer's page: %d, want 403", path, got)
		}
	}
	if still, err := d.f.Pending(t.Context()); err != nil || len(still.Requests) != 1 || still.Requests[0].Answer != nil {
		t.Errorf("the observer's answers reached the request: %+v %v", still, err)
	}
	if rec, err := d.f.Status(t.Context(), "watched"); err != nil || rec.Status == schemas.StatusDead || rec.Status == schemas.StatusClosed {
		t.Errorf("the agent after the observer's actions: %+v %v", rec, err)
	}
	for _, path := range []string{"/api/fleet", "/api/agents/watched", "/api/agents/watched/events"} {
		res, err := http.Get(d.url + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without a token: %d, want 401", path, res.StatusCode)
		}
	}
	// A wrong token is told apart from none.
	wrong, _ := http.NewRequest("GET", d.url+"/api/fleet", nil)
	wrong.Header.Set("Authorization", "Bearer wrong")
	if res, err := http.DefaultClient.Do(wrong); err != nil {
		t.Fatal(err)
	} else {
		said, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized || !strings.Contains(string(said), "is not one this dashboard accepts") {
			t.Errorf("GET /api/fleet with a wrong token: %d %q", res.StatusCode, said)
		}
	}
	// The full token answers, so the agent's turn ends.
	if _, err := d.f.Permit(t.Context(), schemas.PermitRequest{AgentID: "watched", RequestID: req, Decision: schemas.DecisionDeny, By: "test"}); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "the observer sees the answer", `[...document.querySelectorAll(".permission")].some(e => e.textContent.includes("deny by test"))`, 30*time.Second)
	checkNames(t, ctx)
}
