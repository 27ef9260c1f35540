package node_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/internal/fakebackend"
	"github.com/shoalfabric/shoal/internal/natstest"
	"github.com/shoalfabric/shoal/node"
	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// 1,000 opens placed concurrently over two nodes, one of which is stopped
// when a third of them are done: every open succeeds, those placed on the
// stopping node, or on its record after it left, going to the live one.
func TestConcurrentOpensOutliveAStoppedNode(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	run := func(name string) (stop func()) {
		h, err := node.New(node.Config{Name: name, Conn: natstest.Connect(t, srv), Dir: t.TempDir(),
			Backends: []backend.Backend{fakebackend.New(fakebackend.Config{})}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- h.Run(ctx) }()
		select {
		case <-h.Ready():
		case err := <-done:
			t.Fatalf("node %s did not start: %v", name, err)
		}
		var once sync.Once
		stop = func() {
			once.Do(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("node %s: %v", name, err)
				}
			})
		}
		t.Cleanup(stop)
		return stop
	}
	stopDoomed := run("doomed")
	run("live")
	const opens, clients = 1000, 8
	fabrics := make([]*client.Direct, clients)
	for i := range fabrics {
		f, err := client.NewDirect(natstest.Connect(t, srv), client.Config{})
		if err != nil {
			t.Fatal(err)
		}
		fabrics[i] = f
	}
	ctx := natstest.Context(t, 5*time.Minute)
	var done atomic.Int32
	stopped := make(chan struct{})
	go func() {
		for done.Load() < opens/3 {
			time.Sleep(time.Millisecond)
		}
		stopDoomed()
		close(stopped)
	}()
	errs := make(chan error, opens)
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	for i := range opens {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			_, err := fabrics[i%clients].Open(ctx, schemas.OpenRequest{CWD: t.TempDir(), ID: fmt.Sprintf("o%04d", i)})
			if err != nil {
				errs <- fmt.Errorf("open %d: %w (%s)", i, err, schemas.CodeOf(err))
			}
			done.Add(1)
		})
	}
	wg.Wait()
	<-stopped
	close(errs)
	failed := 0
	for err := range errs {
		if failed++; failed <= 5 {
			t.Error(err)
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d opens failed while a live node could take them", failed, opens)
	}
}
