// Package web owns Shoal's web dashboard: the pages and the JSON and
// Server-Sent Events API behind them, served beside the MCP endpoint.
//
// The fleet page lists nodes and agents; an agent's page streams its
// events live from the replay API, resuming a dropped connection at the
// event after the last one the browser saw (the SSE id is the event
// number). Every page and asset is embedded; nothing is fetched at run
// time.
//
// The same bearer tokens as the MCP endpoint guard it. A browser cannot
// send an Authorization header on a navigation or an EventSource, so
// visiting /?token=T once stores T in an HttpOnly, SameSite=Strict cookie
// and redirects to /. The full token may act (open, send, interrupt,
// close, set the model, answer permission requests); the observer token
// sees everything and every action answers 403.
package web
