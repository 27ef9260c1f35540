package schemas

import "testing"

func TestReadable(t *testing.T) {
	for _, c := range []struct {
		in     string
		indent bool
		want   string
	}{
		{`{"command":"a \u0026\u0026 b \u003e c \u003c d"}`, false, `{"command":"a && b > c < d"}`},
		{`{"a":1,"b":[true]}`, true, "{\n  \"a\": 1,\n  \"b\": [\n    true\n  ]\n}"},
		{`not json`, false, `not json`},
		// What a terminal may act on or show reordered stays escaped.
		{`{"path":"a\u009b2J \u202eevil \u001b[1m"}`, false, `{"path":"a\u009b2J \u202eevil \u001b[1m"}`},
	} {
		if got := Readable([]byte(c.in), c.indent); got != c.want {
			t.Errorf("Readable(%s, %v) = %q, want %q", c.in, c.indent, got, c.want)
		}
	}
}
