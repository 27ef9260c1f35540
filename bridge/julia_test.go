package bridge

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"
)

// The worked example of Kaimon's bus: status idle of agent 9f3a1c20,
// version 0x1D, 155 bytes.
const kaimonExample = "" +
	"374a4c1d0400000034100 10a4e616d65" +
	"645475706c651f4e9b440200000014 03" +
	"0107636861 6e6e656c010464617461 01" +
	"0c73657373696f6e5f6e616d6510531f" +
	"4e9b4403000000002100210021 39210e" +
	"6167656e743a3966336131633230 3921" +
	"337b226b696e64223a22737461747573" +
	"222c227475726e223a302c2264617461" +
	"223a7b22737461747573223a2269646c" +
	"65227d7d2105616765 6e74"

func TestJuliaKaimonExample(t *testing.T) {
	want, err := hex.DecodeString(strings.ReplaceAll(kaimonExample, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	got := JuliaNamedTuple("agent:9f3a1c20", `{"kind":"status","turn":0,"data":{"status":"idle"}}`, "agent", DefaultJuliaVersion)
	if len(got) != 155 || !bytes.Equal(got, want) {
		t.Fatalf("got %d bytes\n%s\nwant\n%s", len(got), hex.Dump(got), hex.Dump(want))
	}
	if len(juliaPrefix) != 77 {
		t.Fatalf("the constant prefix is %d bytes, want 77", len(juliaPrefix))
	}
}

func TestJuliaStringBoundaries(t *testing.T) {
	cases := []struct {
		n    int
		head string // the bytes before the string's content
	}{
		{0, "2100"},
		{7, "2107"},
		{8, "392108"},
		{255, "3921ff"},
		{256, "3930" + "0001000000000000"},
		{300, "3930" + "2c01000000000000"},
		{70000, "3930" + "7011010000000000"},
	}
	for _, c := range cases {
		s := strings.Repeat("x", c.n)
		got := JuliaNamedTuple("agent:a", s, "agent", DefaultJuliaVersion)
		field := got[len(juliaPrefix)+len(appendJuliaString(nil, "agent:a")):]
		head, _ := hex.DecodeString(c.head)
		if !bytes.HasPrefix(field, head) || !bytes.Equal(field[len(head):len(head)+c.n], []byte(s)) {
			t.Errorf("a %d-byte string is encoded % x…, want % x then the bytes", c.n, field[:min(len(field), 12)], head)
		}
	}
	// Lengths are bytes, not characters: 3 characters of 3 bytes each.
	got := appendJuliaString(nil, "世界你")
	if got[0] != 0x39 || got[1] != 0x21 || got[2] != 9 {
		t.Errorf("UTF-8 length: % x", got[:3])
	}
	if v := JuliaNamedTuple("a", "b", "c", 0x1C)[3]; v != 0x1C {
		t.Errorf("version byte %#x", v)
	}
}
