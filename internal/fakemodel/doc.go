// Package fakemodel is a scripted fake model server for tests.
//
// A Server listens on a loopback port (127.0.0.1:0, never another address)
// and speaks, on that one port, the wire formats that real agent CLIs and
// Shoal's own backends use to reach a model:
//
//   - the Anthropic Messages API, POST /v1/messages, streamed as SSE the way
//     Claude Code expects it (anthropic.go);
//   - OpenAI chat completions, POST /v1/chat/completions, as opencode and the
//     openai clients expect it, or the mlx_lm.server variant of the same
//     endpoint when Config.MLX is set (openai.go);
//   - the Gemini API, POST /v1beta/models/{model}:streamGenerateContent and
//     :generateContent, as gemini-cli expects it (gemini.go);
//   - Ollama, POST /api/chat, streamed as NDJSON (ollama.go).
//
// A test queues Replies with Script. Every model request, whatever its
// dialect, is recorded (Requests, WaitRequests) and answered with the next
// Reply of one shared FIFO, or with Config.Default once the script is empty.
// A Reply describes what the model "says" (thinking, text, tool calls) and
// how the stream behaves (chunk size, delay, hang, errors before or during
// the stream); each dialect renders it in its own framing.
//
// Auxiliary calls that CLIs make on their own are answered without touching
// the script and are not recorded: Claude Code's HEAD / preconnect (and any
// other unknown path, which gets a 404), gemini-cli's router call (a
// generateContent call asking for JSON that matches a schema, answered with
// a value built from the schema), and opencode's title generation (a user
// message starting with "Generate a title for this conversation").
//
// Point a client at URL(): ANTHROPIC_BASE_URL for Claude Code,
// GOOGLE_GEMINI_BASE_URL for gemini-cli, URL()+"/v1" as the baseURL of an
// OpenAI-compatible provider (opencode), URL() as an Ollama or mlx host:
//
//	s := fakemodel.Start(t, fakemodel.Config{})
//	s.Script(fakemodel.Reply{
//		Text:      "I'll run it.",
//		ToolCalls: []fakemodel.ToolCall{{Name: "Bash", Input: json.RawMessage(`{"command":"echo hi"}`)}},
//	}, fakemodel.Reply{Text: "done"})
//	cmd.Env = append(cmd.Env, "ANTHROPIC_BASE_URL="+s.URL())
//	...
//	reqs, err := s.WaitRequests(ctx, 2) // reqs[1].ToolResults holds "hi"
//
// The wire formats follow what Claude Code 2.1.197, opencode 1.18.33 and
// gemini-cli 0.61.0 send and accept (samples of their requests are in
// testdata/), and the Ollama and mlx_lm.server sources. The package owns nothing else: it holds no global
// state, prints nothing, and a Server is safe for concurrent requests.
package fakemodel
