package local

import (
	"context"
	"encoding/json"

	"github.com/shoalfabric/shoal/schemas"
)

// message is one entry of the conversation the node holds for an agent,
// in a shape both dialects render from.
type message struct {
	Role      string     // system, user, assistant, tool
	Content   string     // the text
	Thinking  string     // an assistant's reasoning, when the model gave any
	ToolCalls []toolCall // an assistant's calls
	ToolName  string     // a tool message's tool
	ToolID    string     // a tool message's call id
}

// toolCall is a call the model made, whole.
type toolCall struct {
	ID        string          // the model's id for it, "" when it gave none
	Name      string          // the tool's name as offered to the model
	Arguments json.RawMessage // a JSON object
}

// toolSpec is a tool offered to the model.
type toolSpec struct {
	Name        string
	Description string
	Parameters  json.RawMessage // a JSON Schema object
}

// chatRequest is one round of a turn.
type chatRequest struct {
	Model    string
	Messages []message
	Tools    []toolSpec
}

// delta is one piece of a streamed answer. Exactly one of its parts is set,
// except the last, which carries Done and may carry Usage.
type delta struct {
	Text      string
	Thinking  string
	ToolCalls []toolCall
	Usage     *schemas.Usage
	Done      bool
	Stop      string // the dialect's finish reason on the last delta
}

// dialect streams one round of chat from a model server.
type dialect interface {
	// chat sends req and calls each with every delta, in order, until the
	// answer ends (a delta with Done), ctx ends, or the stream fails. An
	// error says what failed, in words a person can act on.
	chat(ctx context.Context, req chatRequest, each func(delta) error) error
}

// toolResult is what a tool call returned.
type toolResult struct {
	Text    string                    // for the model: text blocks, and a marker for each image
	Content []schemas.ToolCallContent // for the stream: the blocks as they are, images included
	Failed  bool
}

// toolbox is the tools an agent may call.
type toolbox interface {
	// tools lists what is offered to the model.
	tools() []toolSpec
	// call runs one; a tool the agent may not call, or that does not
	// exist, is a failed result saying so.
	call(ctx context.Context, name string, args json.RawMessage) toolResult
	// close ends every MCP session the toolbox opened.
	close()
}
