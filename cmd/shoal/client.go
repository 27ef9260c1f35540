package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/bridge"
)

// clientOptions are how a command reaches the fabric.
type clientOptions struct {
	url     string
	creds   string
	timeout time.Duration
}

func (o *clientOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.url, "nats", nats.DefaultURL, "NATS `URL` of the fabric")
	fs.StringVar(&o.creds, "creds", "", "NATS credentials `file`")
	durationFlag(fs, &o.timeout, "timeout", 30*time.Second, "how long to wait for an answer")
}

func (o *clientOptions) connect(env *environment, extra ...nats.Option) (*nats.Conn, error) {
	opts := []nats.Option{nats.Name("shoal"), nats.Timeout(5 * time.Second)}
	if o.creds != "" {
		opts = append(opts, nats.UserCredentials(o.creds))
	}
	nc, err := nats.Connect(o.url, append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("cannot reach NATS at %s: %v (is `shoal up` running?)", o.url, err)
	}
	return nc, nil
}

func (o *clientOptions) fabric(env *environment) (*bridge.Fabric, func(), error) {
	nc, err := o.connect(env)
	if err != nil {
		return nil, nil, err
	}
	f, err := bridge.NewFabric(nc, bridge.FabricConfig{Timeout: o.timeout})
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return f, nc.Close, nil
}

func printJSON(env *environment, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(env.io.out, string(b))
	return err
}
