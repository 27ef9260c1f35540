package node

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shoalfabric/shoal/client"
	"github.com/shoalfabric/shoal/schemas"
)

// Bundles of agents on repositories: the node reads the one an agent is
// opened from and writes bundles of its work, in the repositories' object
// store, directly or, confined, a chunk at a time through the relay.

func (s *directStore) getBundle(ctx context.Context, _, name string, w io.Writer) error {
	obs, err := s.js.ObjectStore(ctx, schemas.ReposBucket)
	if err != nil {
		return schemas.Errf(schemas.CodeUnavailable, "the repositories' object store: %v", err)
	}
	obj, err := client.GetObject(ctx, obs, name)
	if err != nil {
		if errors.Is(err, jetstream.ErrObjectNotFound) {
			return schemas.Errf(schemas.CodeInvalid, "bundle %s is not in the object store (sent and expired, or never sent whole)", name)
		}
		return schemas.Errf(schemas.CodeUnavailable, "read bundle %s: %v", name, err)
	}
	defer obj.Close()
	// The object store checks the digest as the last chunk is read.
	if _, err := io.Copy(w, obj); err != nil {
		return schemas.Errf(schemas.CodeUnavailable, "read bundle %s: %v", name, err)
	}
	return nil
}

func (s *directStore) putBundle(ctx context.Context, _, name, desc string, r io.Reader) error {
	obs, err := s.js.ObjectStore(ctx, schemas.ReposBucket)
	if err != nil {
		return schemas.Errf(schemas.CodeUnavailable, "the repositories' object store: %v", err)
	}
	if info, err := obs.GetInfo(ctx, name); err == nil && !info.Deleted && time.Since(info.ModTime) < 12*time.Hour {
		// The same work for the same reader, stored whole within half
		// the store's 24 hours (not about to expire): a bundle's name is
		// its tip and what its reader holds.
		return nil
	}
	if _, err := obs.Put(ctx, jetstream.ObjectMeta{Name: name, Description: desc}, r); err != nil {
		return client.StoreBundleError(name, err)
	}
	return nil
}

// bundleAsk bounds each chunk's request through the relay.
const bundleAsk = time.Minute

func (s *relayStore) getBundle(ctx context.Context, agent, name string, w io.Writer) error {
	subject := schemas.RelaySubject(s.node, schemas.RelayBundleGet, agent)
	for off := int64(0); ; {
		ask := nats.NewMsg(subject)
		ask.Data, _ = json.Marshal(schemas.RelayBundleRequest{Name: name, Offset: off})
		cctx, cancel := context.WithTimeout(ctx, bundleAsk)
		m, err := s.request(cctx, ask) // asked again while the relay is busy
		cancel()
		if err != nil {
			return schemas.Errf(schemas.CodeUnavailable, "read bundle %s through the relay: %v", name, err)
		}
		if m.Header.Get(schemas.HeaderRelayError) != "" {
			var none struct{}
			return schemas.DecodeReply(m.Data, &none)
		}
		if _, err := w.Write(m.Data); err != nil {
			return schemas.Errf(schemas.CodeInternal, "%v", err)
		}
		off += int64(len(m.Data))
		if m.Header.Get(schemas.HeaderBundleLast) == "1" {
			return nil
		}
		if len(m.Data) == 0 {
			return schemas.Errf(schemas.CodeUnavailable, "read bundle %s through the relay: an empty chunk at offset %d", name, off)
		}
	}
}

func (s *relayStore) putBundle(ctx context.Context, agent, name, desc string, r io.Reader) error {
	subject := schemas.RelaySubject(s.node, schemas.RelayBundlePut, agent)
	buf := make([]byte, schemas.BundleChunk)
	for off := int64(0); ; {
		n, err := io.ReadFull(r, buf)
		last := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
		if err != nil && !last {
			return schemas.Errf(schemas.CodeInternal, "%v", err)
		}
		m := nats.NewMsg(subject)
		m.Header.Set(schemas.HeaderBundle, name)
		m.Header.Set(schemas.HeaderBundleOffset, strconv.FormatInt(off, 10))
		if off == 0 {
			m.Header.Set(schemas.HeaderBundleDescription, desc)
		}
		if last {
			m.Header.Set(schemas.HeaderBundleLast, "1")
		}
		m.Data = buf[:n]
		cctx, cancel := context.WithTimeout(ctx, bundleAsk)
		rep, err := s.request(cctx, m) // sent again while the relay is busy
		cancel()
		if err != nil {
			return schemas.Errf(schemas.CodeUnavailable, "store bundle %s through the relay: %v", name, err)
		}
		var none struct{}
		if err := schemas.DecodeReply(rep.Data, &none); err != nil {
			return err
		}
		off += int64(n)
		if last {
			return nil
		}
	}
}
