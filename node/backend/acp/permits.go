package acp

import (
	"crypto/rand"
	"crypto/subtle"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// pluginJS is opencode's plugin, written into each opencode agent's
// configuration directory.
//
//go:embed plugin/shoal-permits.js
var pluginJS []byte

// permits is the loopback endpoint opencode's plugin asks before a tool
// runs: POST /agent/permission with the agent's id and its credential
// in headers and {"tool","args","preset"} as the body. It always answers
// 200 with {"allow":bool,"why":string}.
type permits struct {
	ln     net.Listener
	srv    *http.Server
	served chan struct{}

	mu     sync.Mutex
	agents map[string]permitAgent
}

// permitAgent is what the endpoint knows of an agent.
type permitAgent struct {
	token string
	s     *session
}

func startPermits() (*permits, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	b := &permits{ln: ln, agents: map[string]permitAgent{}, served: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /agent/permission", b.permission)
	b.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		defer close(b.served)
		b.srv.Serve(ln)
	}()
	return b, nil
}

// close stops the endpoint and waits for it.
func (b *permits) close() error {
	err := b.srv.Close()
	<-b.served
	return err
}

func (b *permits) port() string { return strconv.Itoa(b.ln.Addr().(*net.TCPAddr).Port) }

// add registers an agent and returns its credential: 32 random bytes.
func (b *permits) add(id string, s *session) string {
	var raw [32]byte
	rand.Read(raw[:])
	token := hex.EncodeToString(raw[:])
	b.mu.Lock()
	b.agents[id] = permitAgent{token: token, s: s}
	b.mu.Unlock()
	return token
}

func (b *permits) remove(id string) {
	b.mu.Lock()
	delete(b.agents, id)
	b.mu.Unlock()
}

type permitVerdict struct {
	Allow bool   `json:"allow"`
	Why   string `json:"why,omitempty"`
}

func (b *permits) permission(w http.ResponseWriter, r *http.Request) {
	answer := func(v permitVerdict) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(v)
	}
	id := r.Header.Get("X-Shoal-Agent-Id")
	b.mu.Lock()
	a, ok := b.agents[id]
	b.mu.Unlock()
	token := r.Header.Get("X-Shoal-Permits-Token")
	if !ok || token == "" || subtle.ConstantTimeCompare([]byte(token), []byte(a.token)) != 1 {
		answer(permitVerdict{Why: "bad permits credential"})
		return
	}
	var req struct {
		Tool string          `json:"tool"`
		Args json.RawMessage `json:"args"`
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 8<<20))
	if err != nil || json.Unmarshal(body, &req) != nil || req.Tool == "" {
		answer(permitVerdict{Why: "permits endpoint error"})
		return
	}
	allow, why := a.s.judgeTool(req.Tool, req.Args)
	if allow && a.s.asks() && askable(req.Tool) && !allowlisted(a.s.spec.Policy, req.Tool) {
		// Held until a person answers, or the agent ends.
		v := a.s.spec.Asker.Ask(r.Context(), backend.Question{Tool: req.Tool, Input: req.Args})
		allow, why = v.Allow, v.Message
	}
	answer(permitVerdict{Allow: allow, Why: why})
}

// judgeTool decides one of the agent's own tools for the plugin: the
// policy, then every path its arguments name. A refusal is also an error
// event, so the stream says why the call failed.
func (s *session) judgeTool(tool string, args json.RawMessage) (bool, string) {
	ok, why := decide(s.spec.Policy, tool)
	if ok {
		for _, p := range callPaths(args, nil) {
			if _, err := s.ws.resolve(p); err != nil {
				ok, why = false, err.Error()
				break
			}
		}
	}
	if !ok {
		s.mu.Lock()
		s.emit(schemas.ErrorWith("refused a tool call: "+tool+": "+why, map[string]string{"tool": tool}))
		s.mu.Unlock()
	}
	return ok, why
}
