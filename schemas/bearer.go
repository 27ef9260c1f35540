package schemas

import "strings"

// BearerToken is the token of an Authorization header's Bearer
// credentials, and whether the header carries such credentials. The
// scheme is read in any case and spaces may follow it (RFC 9110 §11.1):
// a client that writes "bearer" was told its right token was wrong.
func BearerToken(header string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimLeft(token, " "), true
}
