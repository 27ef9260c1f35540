package web_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/shoalfabric/shoal/broker"

	"github.com/shoalfabric/shoal/bridge/web"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/coordinator"
	"github.com/shoalfabric/shoal/internal/fakemodel"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/internal/peers"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/node/backend/claude"
)

// dash is a fabric with one node running the real claude CLI against a
// fake model, and the dashboard served on a loopback listener.
type dash struct {
	t    *testing.T
	b    *broker.Broker
	f    *client.Direct
	fake *fakemodel.Server
	url  string

	mu      sync.Mutex
	streams []context.CancelFunc // the event streams being served
}

func startDash(t *testing.T, cfg web.Config) *dash {
	t.Helper()
	b := natstest.Start(t)
	f, err := client.NewDirect(natstest.Connect(t, b), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Client = f
	d := &dash{t: t, b: b, f: f, fake: fakemodel.Start(t, fakemodel.Config{})}
	h := web.New(cfg)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/events") {
			ctx, cancel := context.WithCancel(r.Context())
			d.mu.Lock()
			d.streams = append(d.streams, cancel)
			d.mu.Unlock()
			defer cancel()
			r = r.WithContext(ctx)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	d.url = srv.URL

	argv := peers.Claude.Command(t)
	be := claude.New(claude.Config{Path: argv[0], Env: peers.ClaudeEnv(t.TempDir(), d.fake.URL()), StopWait: time.Second})
	host, err := node.New(node.Config{Name: "n1", Conn: natstest.Connect(t, b), Dir: t.TempDir(), Backends: []backend.Backend{be}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- host.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("node: %v", err)
		}
	})
	select {
	case <-host.Ready():
	case err := <-done:
		t.Fatalf("node: %v", err)
	}
	// The coordinator's count of spend, which the fleet page shows.
	l, err := coordinator.NewLedger(coordinator.LedgerConfig{Conn: natstest.Connect(t, b)})
	if err != nil {
		t.Fatal(err)
	}
	counted := make(chan error, 1)
	go func() { counted <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-counted; err != nil {
			t.Errorf("ledger: %v", err)
		}
	})
	return d
}

// cut ends every event stream being served, as a dropped connection
// would: the browser has to reconnect.
func (d *dash) cut() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.streams {
		c()
	}
	d.streams = nil
}

// stored is the event numbers stored for an agent, in stream order.
func (d *dash) stored(id string) []uint64 {
	d.t.Helper()
	var ns []uint64
	err := d.f.Replay(d.t.Context(), []string{id}, client.From{}, false, func(r client.Replayed, g *client.Gap) error {
		if g != nil {
			return g
		}
		if r.Stray == "" {
			ns = append(ns, r.N)
		}
		return nil
	})
	if err != nil {
		d.t.Fatal(err)
	}
	return ns
}

// browser starts Debian's headless Chromium; a machine without it fails
// the test, saying how to install it.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("the dashboard's tests drive Debian's Chromium, which is not installed: apt-get install -y chromium (scripts/test installs it)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.Headless, chromedp.DisableGPU,
		chromedp.WindowSize(1280, 900), chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("proxy-server", "direct://"), chromedp.Flag("proxy-bypass-list", "*"))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	return ctx
}

// do runs browser actions, failing the test on an error.
func do(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatal(err)
	}
}

// eval evaluates JavaScript in the page, awaiting a promise it returns.
func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("%s: %v", js, err)
	}
	return v
}

// waitJS polls a JavaScript condition until it is true.
func waitJS(t *testing.T, ctx context.Context, what, js string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		// An exception, or a page between two documents, is a no yet.
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("(() => { try { return !!("+js+") } catch { return false } })()"))
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			body := eval[string](t, ctx, "document.body.innerText")
			t.Fatalf("%s: not within %v; the page says:\n%s", what, timeout, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// screenshot writes the page as a PNG under the test's artifacts and
// checks it is not blank.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	buf, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.ArtifactDir(), name+".png")
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(buf))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	colours := map[[4]uint32]bool{}
	bounds := img.Bounds()
	for y := bounds.Min.Y; y < bounds.Max.Y; y += 2 {
		for x := bounds.Min.X; x < bounds.Max.X; x += 2 {
			r, g, b, a := img.At(x, y).RGBA()
			colours[[4]uint32{r, g, b, a}] = true
		}
	}
	if len(colours) < 16 || bounds.Dx() < 300 {
		t.Errorf("%s looks blank: %d colours, %v", path, len(colours), bounds)
	}
	t.Logf("screenshot %s: %v, %d colours", path, bounds.Size(), len(colours))
}

// post sends an action to the dashboard with a bearer token, returning
// the status.
func post(t *testing.T, url, token, body string) int {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

var _ = fmt.Sprintf
