package schemas_test

import (
	"testing"

	"github.com/shoalfabric/shoal/schemas"
)

func TestBearerToken(t *testing.T) {
	for header, want := range map[string]string{
		"Bearer tok":   "tok",
		"bearer tok":   "tok",
		"BEARER tok":   "tok",
		"Bearer   tok": "tok",
		" Bearer tok ": "tok",
		"Basic tok":    "",
		"Bearertok":    "",
		"":             "",
	} {
		got, ok := schemas.BearerToken(header)
		if got != want || ok != (want != "") {
			t.Errorf("BearerToken(%q) = %q, %v; want %q", header, got, ok, want)
		}
	}
}
