package natstest

import "go.uber.org/goleak"

// KnownLeaks are the goroutines the NATS client leaves behind by a fault
// of its own, for goleak to ignore. An object store's Put (a repository
// bundle sent to a node) sets up JetStream's asynchronous publish
// replies and tears them down at its end; the listener for reconnects
// that the set-up starts reads its channel only once it runs, and when
// the tear-down has cleared the channel by then it waits on a nil one
// for ever (nats.go v1.55.0, jetstream/publish.go,
// resetPendingAcksOnReconnect). Nothing of Shoal's is in that goroutine.
var KnownLeaks = []goleak.Option{
	goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"),
}
