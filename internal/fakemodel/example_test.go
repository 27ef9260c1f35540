package fakemodel_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/shoalfabric/shoal/internal/fakemodel"
)

// A scripted reply answered over Ollama's /api/chat, without streaming.
func Example() {
	s, err := fakemodel.New(fakemodel.Config{})
	if err != nil {
		panic(err)
	}
	defer s.Close()
	s.Script(fakemodel.Reply{
		Text:      "Checking the weather.",
		ToolCalls: []fakemodel.ToolCall{{Name: "get_weather", Input: json.RawMessage(`{"city":"Tokyo"}`)}},
	})

	resp, err := http.Post(s.URL()+"/api/chat", "application/json", strings.NewReader(
		`{"model":"fake-model","stream":false,"messages":[{"role":"user","content":"Weather in Tokyo?"}]}`))
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	var out struct {
		Message struct {
			Content   string `json:"content"`
			ToolCalls []struct {
				Function struct {
					Name      string          `json:"name"`
					Arguments json.RawMessage `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"message"`
		DoneReason string `json:"done_reason"`
	}
	body, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(body, &out); err != nil {
		panic(err)
	}
	fmt.Println(out.Message.Content)
	fmt.Println(out.Message.ToolCalls[0].Function.Name, string(out.Message.ToolCalls[0].Function.Arguments))
	fmt.Println(out.DoneReason)
	fmt.Printf("%q\n", s.Requests()[0].UserText)
	// Output:
	// Checking the weather.
	// get_weather {"city":"Tokyo"}
	// stop
	// "Weather in Tokyo?"
}
