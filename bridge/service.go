package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/shoalfabric/shoal/schemas"
)

// FabricService is the coordinator's NATS micro service, shoal-fabric:
// requests about the fabric as a whole rather than one node.
const FabricService = "shoal-fabric"

// FabricSubject is where the coordinator answers verb.
func FabricSubject(verb string) string { return "shoal.fabric." + verb }

// Serve registers the fabric service on nc until ctx ends: events (a page
// of an agent's stream) and open (placement, then the node).
func Serve(ctx context.Context, nc *nats.Conn, f *Fabric, version string) error {
	svc, err := micro.AddService(nc, micro.Config{
		Name: FabricService, Version: version,
		Description: "Shoal coordinator: replay and placement",
	})
	if err != nil {
		return fmt.Errorf("register %s: %w", FabricService, err)
	}
	g := svc.AddGroup("shoal.fabric")
	if err := g.AddEndpoint("events", serveJSON(ctx, f.Events)); err != nil {
		return err
	}
	if err := g.AddEndpoint("open", serveJSON(ctx, f.Open)); err != nil {
		return err
	}
	if err := nc.Flush(); err != nil {
		return err
	}
	<-ctx.Done()
	return svc.Stop()
}

func serveJSON[Req, Rep any](ctx context.Context, op func(context.Context, Req) (Rep, error)) micro.Handler {
	return micro.HandlerFunc(func(r micro.Request) {
		go func() {
			var req Req
			var out []byte
			if err := json.Unmarshal(r.Data(), &req); err != nil {
				out, _ = json.Marshal(schemas.ErrorReply{Error: schemas.Errf(schemas.CodeInvalid, "invalid request: %v", err)})
			} else if rep, err := op(ctx, req); err != nil {
				ce, ok := errors.AsType[*schemas.ControlError](err)
				if !ok {
					ce = schemas.Errf(schemas.CodeInternal, "%v", err)
				}
				out, _ = json.Marshal(schemas.ErrorReply{Error: ce})
			} else {
				out, _ = json.Marshal(rep)
			}
			r.Respond(out)
		}()
	})
}
