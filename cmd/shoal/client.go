package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	neturl "net/url"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// clientOptions are how a command reaches the fabric.
type clientOptions struct {
	url     string
	creds   string
	tls     tlsOptions
	timeout time.Duration
	// persistent keeps the connection trying to reconnect for as long as
	// the command runs, for commands that watch (shoal tui).
	persistent bool

	who *broker.Credentials // what --creds are for, once read
	// onCredsGone, when set, is told when the server no longer takes the
	// credentials of a connection made with these options (credsGone).
	onCredsGone func(error)
	// external is set for shoal up's own --nats: a deployment it uses,
	// not one it runs.
	external bool
}

// tlsOptions name the PEM files of one side of TLS.
type tlsOptions struct {
	cert, key, ca string
}

func (t *tlsOptions) register(fs *flag.FlagSet, whose string) {
	fs.StringVar(&t.ca, "tls-ca", "", "PEM `file` of the CA that signed "+whose)
	fs.StringVar(&t.cert, "tls-cert", "", "PEM `file` of this side's TLS certificate")
	fs.StringVar(&t.key, "tls-key", "", "PEM `file` of that certificate's private key")
}

func (o *clientOptions) register(fs *flag.FlagSet) {
	o.registerConn(fs)
	durationFlag(fs, &o.timeout, "timeout", 30*time.Second, "how long to wait for an answer, a `duration`")
}

// registerConn registers how to reach the fabric: --nats, --creds and
// the client side of TLS.
func (o *clientOptions) registerConn(fs *flag.FlagSet) {
	fs.StringVar(&o.url, "nats", nats.DefaultURL, "NATS `URL` of the fabric")
	o.registerAuth(fs)
}

// registerAuth registers --creds and the client side of TLS.
func (o *clientOptions) registerAuth(fs *flag.FlagSet) {
	fs.StringVar(&o.creds, "creds", "", "NATS credentials `file` from `shoal creds` (needed when the coordinator runs with --auth)")
	o.tls.register(fs, "the server's certificate")
}

// credentials reads --creds once; nil when none were given.
func (o *clientOptions) credentials() (*broker.Credentials, error) {
	if o.creds == "" || o.who != nil {
		return o.who, nil
	}
	c, err := broker.ReadCredentials(o.creds)
	if err != nil {
		return nil, usagef("%v", err)
	}
	o.who = &c
	return o.who, nil
}

// options are the NATS options for --creds and TLS.
func (o *clientOptions) options() ([]nats.Option, error) {
	var opts []nats.Option
	c, err := o.credentials()
	if err != nil {
		return nil, err
	}
	if c != nil {
		// A scoped credential receives replies only under its own inbox.
		opts = append(opts, nats.UserCredentials(o.creds), nats.CustomInboxPrefix(c.InboxPrefix()))
	}
	cfg, err := broker.ClientTLS{CA: o.tls.ca, Cert: o.tls.cert, Key: o.tls.key}.Config()
	if err != nil {
		return nil, usagef("%v", err)
	}
	if cfg != nil {
		opts = append(opts, nats.Secure(cfg))
	}
	return opts, nil
}

func (o *clientOptions) connect(env *environment, extra ...nats.Option) (*nats.Conn, error) {
	if err := natsURLs(o.url); err != nil {
		return nil, err
	}
	opts, err := o.options()
	if err != nil {
		return nil, err
	}
	opts = append([]nats.Option{nats.Name("shoal"), nats.Timeout(5 * time.Second),
		// The server refuses what the credentials do not allow; say so
		// rather than let a request wait for its timeout in silence.
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				env.warn("the server refused", err)
			}
			// Said once, however many connections hear it.
			if gone := o.credsGone(err); gone != nil && env.gone.CompareAndSwap(nil, &gone) && o.onCredsGone != nil {
				o.onCredsGone(gone)
			}
		}),
	}, opts...)
	nc, err := nats.Connect(o.url, append(opts, extra...)...)
	if err != nil {
		return nil, o.explain(err)
	}
	env.dialed.Store(o)
	return nc, nil
}

// natsURLs says what is wrong with a --nats value (servers separated by
// commas), or nil: nats.go dials a host whatever scheme names it, so a
// mistyped one would reach the server, or be retried for ever, unsaid.
func natsURLs(list string) error {
	if raw, why := badNatsURL(list); why != "" {
		return usagef("--nats %q: %s", raw, why)
	}
	return nil
}

// badNatsURL finds the first server of a nats setting that is wrong, and
// why; "" when none is.
func badNatsURL(list string) (raw, why string) {
	for _, raw := range strings.Split(list, ",") {
		raw = strings.TrimSpace(raw)
		if !strings.Contains(raw, "://") {
			continue // host:port, as nats.go takes it
		}
		u, err := neturl.Parse(raw)
		switch {
		case err != nil:
			return raw, fmt.Sprintf("not a URL: %v", err)
		case !slices.Contains([]string{"nats", "tls", "ws", "wss"}, u.Scheme):
			return raw, fmt.Sprintf("the scheme %q is not nats, tls, ws or wss", u.Scheme)
		case u.Host == "":
			return raw, "names no host"
		}
	}
	return "", ""
}

// refusedError is a dial the server refused for a reason retrying does
// not mend: credentials or certificates.
type refusedError struct{ error }

func (e refusedError) Unwrap() error { return e.error }

// explain turns a failed dial into what to do about it.
func (o *clientOptions) explain(err error) error {
	if e := o.refused(err); e != nil {
		return refusedError{e}
	}
	if o.external {
		return schemas.Errf(schemas.CodeUnavailable, "cannot reach NATS at %s: %v (shoal up --nats on the command line names a NATS deployment to use instead of the embedded server; leave it out to run the embedded one)", o.url, err)
	}
	return schemas.Errf(schemas.CodeUnavailable, "cannot reach NATS at %s: %v (is `shoal up` running?)", o.url, err)
}

// refused says what setting a dial the server refused lacks; a refusal is
// a wrong command line (exit 2), not a failure to retry.
func (o *clientOptions) refused(err error) error {
	if e := o.refusal(err); e != nil {
		return schemas.Errf(schemas.CodeInvalid, "%s", e)
	}
	return nil
}

func (o *clientOptions) refusal(err error) error { return o.refusalAt(o.url, err) }

// refusalAt is refusal of a dial to url (a leaf node's hub, for one).
func (o *clientOptions) refusalAt(url string, err error) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "Authorization Violation") && o.creds == "":
		return fmt.Errorf("NATS at %s requires credentials: give --creds FILE (issued by `shoal creds` on the coordinator)", url)
	case strings.Contains(msg, "Authorization Violation"), strings.Contains(msg, "Authentication Expired"):
		return fmt.Errorf("NATS at %s refused the credentials in %s: %v", url, o.creds, err)
	case strings.Contains(msg, "certificate signed by unknown authority"), strings.Contains(msg, "certificate is not trusted"):
		if o.tls.ca == "" {
			return fmt.Errorf("NATS at %s presents a certificate this machine does not trust: give --tls-ca FILE", url)
		}
		return fmt.Errorf("NATS at %s presents a certificate the CA in %s did not sign: %v", url, o.tls.ca, err)
	case strings.Contains(msg, "secure connection required"):
		return fmt.Errorf("NATS at %s requires TLS: give --tls-ca FILE (and --tls-cert/--tls-key if it asks for a client certificate)", url)
	case strings.Contains(msg, "certificate required"), strings.Contains(msg, "bad certificate"):
		return fmt.Errorf("NATS at %s requires a client certificate: give --tls-cert and --tls-key (%v)", url, err)
	}
	return nil
}

func (o *clientOptions) fabric(env *environment) (client.Client, func(), error) {
	if o.timeout <= 0 {
		// The client's zero is its default: 0 would not mean what it says.
		return nil, nil, usagef("--timeout %s: a request waits for more than no time; give a duration such as 30s", o.timeout)
	}
	var extra []nats.Option
	if o.persistent {
		extra = append(extra, nats.MaxReconnects(-1))
	}
	nc, err := o.connect(env, extra...)
	if err != nil {
		return nil, nil, err
	}
	// A progress line names paths and what nodes said: one line, with no
	// escape sequence of theirs.
	cfg := client.Config{Timeout: o.timeout, Progress: func(line string) { fmt.Fprintln(env.io.err, "shoal: "+oneLine(line)) }}
	if c := o.who; c != nil && c.Role != broker.RoleCoordinator {
		// Scoped credentials reach neither the nodes nor the stream:
		// everything goes through the coordinator.
		cfg.ViaCoordinator = true
		cfg.ReadOnly = c.Role == broker.RoleObserver
		switch c.Role {
		case broker.RoleNode:
			nc.Close()
			return nil, nil, usagef("the credentials in %s are a node's (%s); a client needs `shoal creds client NAME` or `shoal creds observer NAME`", o.creds, c.Name)
		case broker.RoleSystem:
			nc.Close()
			return nil, nil, usagef("the credentials in %s are the NATS system account's (%s), for monitoring the servers; a client needs `shoal creds client NAME` or `shoal creds observer NAME`", o.creds, c.Name)
		}
	}
	f, err := client.New(nc, cfg)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return f, nc.Close, nil
}

// printJSON prints v as indented JSON, with the characters a terminal
// may act on or show reordered, which JSON leaves as they are (C1
// controls, bidirectional overrides), escaped as JSON allows.
func printJSON(env *environment, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(env.io.out, schemas.EscapeUnreadable(string(b)))
	return err
}
