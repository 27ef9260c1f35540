package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/shoalfabric/shoal/schemas"
)

// FabricService is the coordinator's NATS micro service, shoal-fabric:
// the whole fabric behind one door, for clients whose credentials reach
// neither the nodes nor the stream.
const FabricService = "shoal-fabric"

// FabricSubject is where the coordinator answers verb.
func FabricSubject(verb string) string { return "shoal.fabric." + verb }

// Serve registers the fabric service on nc until ctx ends: every verb of
// the fabric (open through placement, the requests about an agent, sent on
// to its owner, the reads of records and nodes), a page of an agent's
// stream (events) and a streamed replay (replay).
//
// Replies go only to _INBOX subjects: a reply is published with the
// coordinator's rights, and a requester may name any reply subject.
func Serve(ctx context.Context, nc *nats.Conn, f *Fabric, version string) error {
	svc, err := micro.AddService(nc, micro.Config{
		Name: FabricService, Version: version,
		Description: "Shoal coordinator: placement, control, replay",
	})
	if err != nil {
		return fmt.Errorf("register %s: %w", FabricService, err)
	}
	g := svc.AddGroup("shoal.fabric")
	agent := func(op func(context.Context, string) (any, error)) func(context.Context, schemas.AgentRequest) (any, error) {
		return func(ctx context.Context, r schemas.AgentRequest) (any, error) { return op(ctx, r.AgentID) }
	}
	endpoints := map[string]micro.Handler{
		"events":    serveJSON(ctx, f.Events),
		"open":      serveJSON(ctx, f.Open),
		"send":      serveJSON(ctx, f.Send),
		"run":       serveJSON(ctx, f.Run),
		"output":    serveJSON(ctx, f.Output),
		"set_model": serveJSON(ctx, f.SetModel),
		"status":    serveJSON(ctx, agent(func(ctx context.Context, id string) (any, error) { return f.Status(ctx, id) })),
		"record": serveJSON(ctx, agent(func(ctx context.Context, id string) (any, error) {
			rec, _, err := f.Record(ctx, id)
			return rec, err
		})),
		"interrupt": serveJSON(ctx, func(ctx context.Context, r schemas.AgentRequest) (schemas.InterruptReply, error) {
			return f.Interrupt(ctx, r.AgentID, WithRequestID(r.RequestID))
		}),
		"close": serveJSON(ctx, func(ctx context.Context, r schemas.AgentRequest) (schemas.CloseReply, error) {
			return f.Close(ctx, r.AgentID, WithRequestID(r.RequestID))
		}),
		"list": serveJSON(ctx, func(ctx context.Context, _ schemas.ListRequest) (schemas.ListReply, error) {
			recs, err := f.List(ctx)
			return schemas.ListReply{Agents: recs}, err
		}),
		"nodes": serveJSON(ctx, func(ctx context.Context, _ struct{}) (schemas.NodesReply, error) {
			nodes, err := f.Nodes(ctx)
			return schemas.NodesReply{Nodes: nodes}, err
		}),
		"replay": micro.HandlerFunc(func(r micro.Request) {
			if !toInbox(r) {
				return
			}
			go f.serveReplay(ctx, r)
		}),
	}
	for name, h := range endpoints {
		if err := g.AddEndpoint(name, h); err != nil {
			return err
		}
	}
	if err := nc.Flush(); err != nil {
		return err
	}
	<-ctx.Done()
	return svc.Stop()
}

// toInbox reports whether a request's reply subject is an inbox, the only
// kind of subject the coordinator answers on.
func toInbox(r micro.Request) bool {
	return strings.HasPrefix(r.Reply(), "_INBOX.")
}

func serveJSON[Req, Rep any](ctx context.Context, op func(context.Context, Req) (Rep, error)) micro.Handler {
	return micro.HandlerFunc(func(r micro.Request) {
		if !toInbox(r) {
			return
		}
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
