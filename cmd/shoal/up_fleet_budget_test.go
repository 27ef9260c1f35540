package main

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/schemas"
)

// The fleet runs under shoal up --budget-tokens 1000000; a person adds a
// dollar cap with shoal budget set --fleet --usd 5 ("a limit not given
// stays as it is"). The coordinator restarts (systemd's
// Restart=on-failure, a crash, an upgrade) with the same command line,
// which gives no --budget-usd: the restart wrote the fleet's budget whole,
// and the person's dollar cap was gone, silently. A restart sets the
// limits it is given only.
func TestUpRestartKeepsTheFleetsDollarCap(t *testing.T) {
	t.Parallel()
	b := natstest.Start(t)
	f, err := client.NewDirect(natstest.Connect(t, b), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	connect := connector(func(string) (*nats.Conn, error) { return nats.Connect(b.ClientURL()) })
	up := &upOptions{fleet: schemas.BudgetRequest{Tokens: 1000000}}
	if err := up.setFleetBudget(t.Context(), connect); err != nil { // the first start
		t.Fatal(err)
	}
	// The person: shoal budget set --fleet --usd 5 (the CLI keeps the
	// tokens as they are).
	if err := f.SetBudget(t.Context(), schemas.BudgetRequest{Fleet: true, Tokens: 1000000, USD: 5}); err != nil {
		t.Fatal(err)
	}
	restarted := &upOptions{fleet: schemas.BudgetRequest{Tokens: 1000000}}
	if err := restarted.setFleetBudget(t.Context(), connect); err != nil { // the restart
		t.Fatal(err)
	}
	rep, err := f.Budgets(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range rep.Budgets {
		if l.Fleet && l.Budget.USD != 5 {
			t.Errorf("after a restart of shoal up --budget-tokens 1000000, the fleet's budget is %s: the $5 a person set is lifted", l.Budget)
		}
	}
}
