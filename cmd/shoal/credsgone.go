package main

import (
	"errors"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/schemas"
)

// Credentials can stop being good while a command runs: they expire
// (shoal creds --expires), or the server revokes them. The server then
// says so ("-ERR 'User Authentication Expired'"), ends the connection,
// and refuses every reconnection ("Authorization Violation"), after two
// of which nats.go closes the connection for good. Without a word of it
// a node failed its heartbeat for ever, and a client failed with whatever
// its request met ("the coordinator stopped streaming the replay").

// credsGone says, of an error the server sent on a connection made with
// --creds, whether it means the credentials are no longer taken, and
// what to do; nil when it does not. A refusal on reconnecting counts when
// the credentials' expiry has passed: the connection was away when they
// expired, and the server never said so.
func (o *clientOptions) credsGone(err error) error {
	if o.creds == "" || err == nil {
		return nil
	}
	expired := errors.Is(err, nats.ErrAuthExpired)
	if errors.Is(err, nats.ErrAuthorization) && o.who != nil && !o.who.Expires.IsZero() && !time.Now().Before(o.who.Expires) {
		expired = true
	}
	switch {
	case expired:
		return schemas.Errf(schemas.CodeInvalid, "the credentials in %s expired%s, and NATS at %s takes them no more: issue new ones on the coordinator (%s) and use those",
			o.creds, o.expiry(), o.url, o.reissue())
	case errors.Is(err, nats.ErrAuthRevoked):
		return schemas.Errf(schemas.CodeInvalid, "NATS at %s revoked the credentials in %s: issue new ones on the coordinator (%s) and use those",
			o.url, o.creds, o.reissue())
	}
	return nil
}

// expiry is " at TIME" for credentials that carry an expiry.
func (o *clientOptions) expiry() string {
	if o.who == nil || o.who.Expires.IsZero() {
		return ""
	}
	return " at " + o.who.Expires.Format(time.RFC3339)
}

// reissue is the command that issues credentials like these.
func (o *clientOptions) reissue() string {
	if o.who == nil {
		return "shoal creds ROLE NAME"
	}
	return "shoal creds " + string(o.who.Role) + " " + o.who.Name
}

// credsExpired is credsGone's error for credentials whose expiry has
// passed, whatever the server said (nil when it has not): a command that
// failed after its credentials expired failed for that, even when the
// server's word of it is not yet handled.
func (o *clientOptions) credsExpired() error {
	if o.who == nil || o.who.Expires.IsZero() || time.Now().Before(o.who.Expires) {
		return nil
	}
	return o.credsGone(nats.ErrAuthExpired)
}
