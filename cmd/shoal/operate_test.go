package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/schemas"
)

// shoal up --monitor serves the NATS server's HTTP monitoring, and with
// --auth a system account user issued by shoal creds can make the
// server's monitoring requests ($SYS.REQ.…), but not those that change a
// server; a node's credentials cannot make any. Off loopback the
// monitoring listener needs --auth like any other.
func TestMonitorAndSystemAccount(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	authDir := filepath.Join(dir, "keys")
	creds := map[string]string{}
	for _, c := range [][2]string{{"system", "ops"}, {"node", "box"}, {"client", "cli"}} {
		path := filepath.Join(dir, c[1]+".creds")
		if code, _, errOut := runShoal(t, dir, nil, "creds", c[0], c[1], "--out", path, "--auth-dir", authDir); code != 0 {
			t.Fatalf("shoal creds %s %s: %s", c[0], c[1], errOut)
		}
		creds[c[1]] = path
	}
	up := startShoal(t, dir, nil, "up", "--auth", "--auth-dir", authDir, "--port", "-1", "--monitor", "127.0.0.1:0",
		"--no-node", "--no-bus", "--mcp-listen", "127.0.0.1:0")
	url := strings.TrimPrefix(up.waitLine("shoal: NATS listening on "), "shoal: NATS listening on ")
	monitor, _, _ := strings.Cut(strings.TrimPrefix(up.waitLine("shoal: NATS monitoring "), "shoal: NATS monitoring "), " ")
	up.waitLine("shoal: ready")

	res, err := http.Get(monitor + "/varz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var varz struct {
		ServerID     string `json:"server_id"`
		Port         int    `json:"port"`
		AuthRequired bool   `json:"auth_required"`
	}
	if err := json.Unmarshal(body, &varz); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("GET /varz: %s %s %v", res.Status, body, err)
	}
	if varz.ServerID == "" || !strings.HasSuffix(url, ":"+strconv.Itoa(varz.Port)) || !varz.AuthRequired {
		t.Errorf("/varz of a server at %s: %s", url, body)
	}

	connect := func(who string, refused chan<- error, opts ...nats.Option) *nats.Conn {
		t.Helper()
		opts = append(opts, nats.UserCredentials(creds[who]), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case refused <- err:
			default:
			}
		}))
		nc, err := nats.Connect(url, opts...)
		if err != nil {
			t.Fatalf("connect as %s: %v", who, err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	sysRefused := make(chan error, 1)
	sys := connect("ops", sysRefused)
	m, err := sys.Request("$SYS.REQ.SERVER.PING", nil, 10*time.Second)
	if err != nil {
		t.Fatalf("the system user's server ping: %v", err)
	}
	var ping struct {
		Server struct {
			ID string `json:"id"`
		} `json:"server"`
	}
	if err := json.Unmarshal(m.Data, &ping); err != nil || ping.Server.ID != varz.ServerID {
		t.Errorf("the server ping answered %s (%v); want server %s", m.Data, err, varz.ServerID)
	}
	m, err = sys.Request("$SYS.REQ.SERVER."+varz.ServerID+".VARZ", nil, 10*time.Second)
	if err != nil || !strings.Contains(string(m.Data), `"server_id":"`+varz.ServerID+`"`) {
		t.Fatalf("the system user's VARZ request: %v %.300s", err, msgBody(m))
	}
	permissionViolation := func(who string, refused <-chan error, subject string) {
		t.Helper()
		select {
		case err := <-refused:
			if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), subject) {
				t.Errorf("%s publishing to %s: %v", who, subject, err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("%s published to %s without a permissions violation", who, subject)
		}
	}
	kick := "$SYS.REQ.SERVER." + varz.ServerID + ".KICK"
	if err := sys.Publish(kick, []byte(`{"cid":1}`)); err != nil {
		t.Fatal(err)
	}
	permissionViolation("the system user", sysRefused, kick)

	nodeRefused := make(chan error, 1)
	box := connect("box", nodeRefused, nats.CustomInboxPrefix(schemas.InboxPrefix("node", "box")))
	if err := box.PublishRequest("$SYS.REQ.SERVER.PING", box.NewRespInbox(), nil); err != nil {
		t.Fatal(err)
	}
	permissionViolation("a node", nodeRefused, "$SYS.REQ.SERVER.PING")

	code, _, errOut := runShoal(t, t.TempDir(), []string{"SHOAL_NATS=" + url, "SHOAL_CREDS=" + creds["ops"]}, "ls")
	if code != 2 || !strings.Contains(errOut, "the NATS system account's") {
		t.Errorf("shoal ls with system credentials: exit %d, %q", code, errOut)
	}
	code, _, errOut = runShoal(t, t.TempDir(), nil, "up", "--port", "-1", "--monitor", "0.0.0.0:0", "--no-node", "--no-bus", "--no-mcp")
	if code != 2 || !strings.Contains(errOut, "monitoring connections on 0.0.0.0 without authentication") {
		t.Errorf("up --monitor 0.0.0.0:0 without --auth: exit %d, %q", code, errOut)
	}
}

func msgBody(m *nats.Msg) string {
	if m == nil {
		return ""
	}
	return string(m.Data)
}

// A NATS deployment shared with other applications gives Shoal an
// account of its own (here in the server's configuration file, without
// Shoal's operator): shoal up --nats provisions the stream and buckets in
// that account and serves there, and another account's users see none of
// it.
func TestUpInItsOwnAccountOfASharedDeployment(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	conf := filepath.Join(dir, "nats.conf")
	os.WriteFile(conf, []byte(fmt.Sprintf(`listen: 127.0.0.1:-1
max_payload: 8MB
jetstream { store_dir: %q }
accounts {
  SHOAL { jetstream: enabled, users: [ { user: shoal, password: s3cret } ] }
  APP { jetstream: enabled, users: [ { user: app, password: other } ] }
}
`, filepath.Join(dir, "js"))), 0o600)
	ns := startConfNATS(t, conf)
	addr := strings.TrimPrefix(ns.ClientURL(), "nats://")
	up := startShoal(t, dir, nil, "up", "--nats", "nats://shoal:s3cret@"+addr, "--no-node", "--no-bus", "--mcp-listen", "127.0.0.1:0")
	up.waitLine("shoal: using NATS at ")
	up.waitLine("shoal: ready")

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, c := range []struct {
		user, password string
		sees           bool
	}{{"shoal", "s3cret", true}, {"app", "other", false}} {
		nc, err := nats.Connect(ns.ClientURL(), nats.UserInfo(c.user, c.password))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		_, err = js.Stream(ctx, schemas.StreamName)
		if sees := err == nil; sees != c.sees {
			t.Errorf("user %s finds the stream %s: %v (err %v)", c.user, schemas.StreamName, sees, err)
		}
		_, err = js.KeyValue(ctx, schemas.AgentsBucket)
		if sees := err == nil; sees != c.sees {
			t.Errorf("user %s finds the bucket %s: %v (err %v)", c.user, schemas.AgentsBucket, sees, err)
		}
		_, err = nc.Request("$SRV.PING."+schemas.FabricService, nil, 2*time.Second)
		if sees := err == nil; sees != c.sees {
			t.Errorf("user %s reaches the %s service: %v (err %v)", c.user, schemas.FabricService, sees, err)
		}
	}
}

// The monitoring endpoints give away nothing a command line carried (a
// token given as --mcp-token, which nats-server's /debug/vars printed as
// the process's cmdline), and on loopback they answer loopback Host
// names only: a page whose name it made resolve to 127.0.0.1 (DNS
// rebinding) cannot read them.
func TestMonitorKeepsTheCommandLineAndRefusesOtherHosts(t *testing.T) {
	t.Parallel()
	const secret = "token-given-on-the-command-line"
	up := startShoal(t, t.TempDir(), nil, "up", "--port", "-1", "--monitor", "127.0.0.1:0",
		"--no-node", "--no-bus", "--mcp-listen", "127.0.0.1:0", "--mcp-token", secret)
	monitor, _, _ := strings.Cut(strings.TrimPrefix(up.waitLine("shoal: NATS monitoring "), "shoal: NATS monitoring "), " ")
	up.waitLine("shoal: ready")
	get := func(path, host string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, monitor+path, nil)
		if host != "" {
			req.Host = host
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(body)
	}
	for _, path := range []string{"/", "/varz", "/connz", "/routez", "/gatewayz", "/leafz", "/subsz", "/stacksz", "/accountz",
		"/accstatz", "/jsz", "/healthz", "/ipqueuesz", "/raftz", "/debug/vars", "/expvarz"} {
		if code, body := get(path, ""); strings.Contains(body, secret) {
			t.Errorf("GET %s (%d) gives away the command line's token", path, code)
		}
	}
	if code, body := get("/varz", ""); code != http.StatusOK || !strings.Contains(body, `"server_id"`) {
		t.Errorf("GET /varz: %d %.200s", code, body)
	}
	_, port, _ := strings.Cut(strings.TrimPrefix(monitor, "http://"), ":")
	for _, host := range []string{"rebound.example:" + port, "rebound.example"} {
		if code, body := get("/varz", host); code == http.StatusOK || strings.Contains(body, "server_id") {
			t.Errorf("GET /varz with Host %s answered %d %.200s; want a refusal", host, code, body)
		}
	}
	if code, _ := get("/varz", "localhost:"+port); code != http.StatusOK {
		t.Errorf("GET /varz with Host localhost answered %d", code)
	}
	// Nor the subjects the coordinator subscribes to: some are its
	// secrets (a replay's flow control, where an answer keeps the replay
	// going, was read from /connz?subs=detail and answered by an observer
	// for replays it had named others' inboxes for).
	for _, path := range []string{"/connz?subs=detail", "/connz?subs=1", "/connz?subs=true&auth=1", "/subsz?subs=1", "/subscriptionsz?subs=1&test=shoal.relay-acks.x.1",
		"/routez?subs=1", "/leafz?subs=1", "/accountz?acc=SHOAL"} {
		code, body := get(path, "")
		if strings.Contains(body, "shoal.relay-acks.") || strings.Contains(body, `"subscriptions_list`) {
			t.Errorf("GET %s (%d) lists subscriptions: %.300s", path, code, body)
		}
	}
	if code, body := get("/connz?subs=detail", ""); code != http.StatusOK || !strings.Contains(body, `"connections"`) {
		t.Errorf("GET /connz?subs=detail: %d %.200s; want the connections, without their subscriptions", code, body)
	}
}
