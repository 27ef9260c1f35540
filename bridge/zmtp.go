package bridge

import (
	"encoding/binary"
	"fmt"
)

// zmtpReader follows the bytes a peer sends: the 64-byte greeting, then
// frames (a flags byte, a size of one byte or, when the flags say long,
// eight, and the body).
type zmtpReader struct {
	greeting int // greeting bytes read
	frames   int // frames read whole
	head     [9]byte
	headLen  int
	body     uint64 // body bytes still to come
}

const zmtpGreeting = 64

// greeted reports whether the greeting and the first command (the
// handshake's READY) are in.
func (z *zmtpReader) greeted() bool { return z.greeting == zmtpGreeting && z.frames > 0 }

// feed takes the next bytes the peer sent; an error when a frame claims
// more than maxPeerFrame.
func (z *zmtpReader) feed(p []byte) error {
	for len(p) > 0 {
		switch {
		case z.greeting < zmtpGreeting:
			k := min(zmtpGreeting-z.greeting, len(p))
			z.greeting += k
			p = p[k:]
		case z.body > 0:
			k := min(z.body, uint64(len(p)))
			z.body -= k
			p = p[k:]
			if z.body == 0 {
				z.frames++
			}
		default:
			z.head[z.headLen] = p[0]
			z.headLen++
			p = p[1:]
			long := z.head[0]&0x02 != 0
			var size uint64
			switch {
			case !long && z.headLen == 2:
				size = uint64(z.head[1])
			case long && z.headLen == 9:
				size = binary.BigEndian.Uint64(z.head[1:9])
			default:
				continue
			}
			if size > maxPeerFrame {
				return fmt.Errorf("a frame of %d bytes, more than %d", size, maxPeerFrame)
			}
			z.headLen, z.body = 0, size
			if size == 0 {
				z.frames++
			}
		}
	}
	return nil
}

// ZMTP frame flags.
const (
	zmtpMore    = 0x01
	zmtpLong    = 0x02
	zmtpCommand = 0x04
)

// zmtpSender follows the bytes the bus sends a peer, to find where each
// message begins and ends: a message is the frames up to the first
// without the MORE flag. The greeting and commands are never dropped.
type zmtpSender struct {
	greeting int // greeting bytes sent
	head     [9]byte
	headLen  int
	body     uint64 // body bytes still to come
	within   bool   // a message's frames are under way
	dropping bool   // the message under way is dropped
}

// step takes the first bytes of p that belong together: what is left of
// the greeting, one byte of a frame's header, or what is left of a
// frame's body. It returns how many it took, whether they are dropped,
// and whether they end a message. drop is asked, at the first byte of
// each message, whether to drop the whole message.
func (z *zmtpSender) step(p []byte, drop func() bool) (n int, dropped, ended bool) {
	switch {
	case z.greeting < zmtpGreeting:
		n = min(zmtpGreeting-z.greeting, len(p))
		z.greeting += n
		return n, false, false
	case z.body > 0:
		n = int(min(z.body, uint64(len(p))))
		z.body -= uint64(n)
		return n, z.dropping, z.body == 0 && z.frameDone()
	}
	if z.headLen == 0 && !z.within {
		z.within = true
		z.dropping = p[0]&zmtpCommand == 0 && drop()
	}
	z.head[z.headLen] = p[0]
	z.headLen++
	long := z.head[0]&zmtpLong != 0
	switch {
	case !long && z.headLen == 2:
		z.body = uint64(z.head[1])
	case long && z.headLen == 9:
		z.body = binary.BigEndian.Uint64(z.head[1:9])
	default:
		return 1, z.dropping, false
	}
	z.headLen = 0
	return 1, z.dropping, z.body == 0 && z.frameDone()
}

// frameDone notes a frame's end, and reports whether it ends a message
// (a command ends nothing: it is not a message).
func (z *zmtpSender) frameDone() bool {
	flags := z.head[0]
	if flags&zmtpMore != 0 {
		return false
	}
	z.within = false
	return flags&zmtpCommand == 0
}
