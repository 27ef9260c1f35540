// Command install puts the pinned agent CLIs Shoal's tests use into the
// peers cache folder (see package peers), skipping those already there.
//
//	go run ./internal/peers/install [name ...]
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"time"

	"github.com/shoalfabric/shoal/internal/peers"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	want := os.Args[1:]
	root := peers.Dir()
	failed := false
	for _, p := range peers.All {
		if len(want) > 0 && !slices.Contains(want, p.Name) {
			continue
		}
		start := time.Now()
		fmt.Printf("peers: %s (%s) ", p.Name, p.Spec())
		installed, err := p.Install(ctx, root)
		switch {
		case err != nil:
			fmt.Printf("FAILED\n%v\n", err)
			failed = true
		case installed:
			fmt.Printf("installed in %s (%.1fs)\n", p.InstallDir(root), time.Since(start).Seconds())
		default:
			fmt.Printf("already in %s\n", p.InstallDir(root))
		}
	}
	if failed {
		os.Exit(1)
	}
}
