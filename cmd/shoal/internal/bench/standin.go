package bench

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"
)

// StandinArg is the hidden subcommand that runs the stand-in claude CLI:
//
//	shoal __standin --events N [--rate R] [-- claude's own arguments]
//
// It speaks the claude CLI's stream-json on stdin and stdout. On each user
// line it prints the turn's system and message_start lines, then N text
// deltas, as fast as it can or R per second, then a result whose
// output_tokens is the number of deltas it printed. Delta k's text is
// "s<k>t<unix nanoseconds> ", the time just before the line was written,
// so whoever sees the delta knows how long it took to get there. Each
// line is one write to stdout.
const StandinArg = "__standin"

// RunStandin runs the stand-in with its arguments (after StandinArg) on
// the process's stdin and stdout, and returns the exit code.
func RunStandin(args []string) int {
	events, rate := 0, 0.0
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "--version":
			fmt.Println("0.0.0 (shoal bench stand-in claude CLI)")
			return 0
		case "--events", "--rate":
			if i+1 == len(args) {
				fmt.Fprintf(os.Stderr, "%s: %s needs a value\n", StandinArg, args[i])
				return 2
			}
			v, err := strconv.ParseFloat(args[i+1], 64)
			if err != nil || v < 0 {
				fmt.Fprintf(os.Stderr, "%s: %s %q is not a number\n", StandinArg, args[i], args[i+1])
				return 2
			}
			if args[i] == "--events" {
				events = int(v)
			} else {
				rate = v
			}
			i++
		case "--":
			// claude's own arguments follow; only --version and auth
			// status (asked when the node looks for the CLI) matter.
			rest := args[i+1:]
			for _, a := range rest {
				if a == "--version" {
					fmt.Println("0.0.0 (shoal bench stand-in claude CLI)")
					return 0
				}
			}
			if len(rest) >= 2 && rest[0] == "auth" && rest[1] == "status" {
				fmt.Println(`{"loggedIn": true, "authMethod": "none"}`)
				return 0
			}
			i = len(args)
		}
	}
	if err := standin(os.Stdin, os.Stdout, events, rate); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", StandinArg, err)
		return 1
	}
	return 0
}

func standin(in io.Reader, out io.Writer, events int, rate float64) error {
	session := fmt.Sprintf("00000000-0000-4000-8000-%012d", os.Getpid())
	lines := make(chan []byte, 16)
	go func() {
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			lines <- append([]byte(nil), sc.Bytes()...)
		}
		close(lines)
	}()
	write := func(b []byte) error {
		_, err := out.Write(b)
		return err
	}
	for l := range lines {
		var m struct {
			Type      string `json:"type"`
			RequestID string `json:"request_id"`
		}
		if json.Unmarshal(l, &m) != nil {
			continue
		}
		switch m.Type {
		case "control_request":
			rid, _ := json.Marshal(m.RequestID)
			if err := write([]byte(`{"type":"control_response","response":{"subtype":"success","request_id":` + string(rid) + "}}\n")); err != nil {
				return err
			}
			continue
		case "user":
		default:
			continue
		}
		if err := write([]byte(`{"type":"system","subtype":"init","session_id":"` + session + "\"}\n" +
			`{"type":"stream_event","event":{"type":"message_start"}}` + "\n")); err != nil {
			return err
		}
		start := time.Now()
		buf := make([]byte, 0, 256)
		var uuid [16]byte
		for k := 1; k <= events; k++ {
			if rate > 0 {
				if d := time.Until(start.Add(time.Duration(float64(k-1) / rate * float64(time.Second)))); d > 0 {
					time.Sleep(d)
				}
			}
			// The CLI's own line: its keys in its order, its session and a
			// uuid per line.
			buf = append(buf[:0], `{"type":"stream_event","event":{"delta":{"text":"s`...)
			buf = strconv.AppendInt(buf, int64(k), 10)
			buf = append(buf, 't')
			buf = strconv.AppendInt(buf, time.Now().UnixNano(), 10)
			buf = append(buf, ` ","type":"text_delta"},"index":0,"type":"content_block_delta"},"session_id":"`...)
			buf = append(buf, session...)
			buf = append(buf, `","parent_tool_use_id":null,"uuid":"`...)
			binary.BigEndian.PutUint64(uuid[:], uint64(os.Getpid()))
			binary.BigEndian.PutUint64(uuid[8:], uint64(k))
			buf = appendUUID(buf, uuid)
			buf = append(buf, "\"}\n"...)
			if err := write(buf); err != nil {
				return err
			}
		}
		if err := write([]byte(`{"type":"result","subtype":"success","is_error":false,"stop_reason":"end_turn","session_id":"` + session +
			`","usage":{"input_tokens":0,"output_tokens":` + strconv.Itoa(events) + `,"cache_read_input_tokens":0,"cache_creation_input_tokens":0}}` + "\n")); err != nil {
			return err
		}
	}
	return nil
}

// appendUUID appends u in the 8-4-4-4-12 form.
func appendUUID(b []byte, u [16]byte) []byte {
	for i, c := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			b = append(b, '-')
		}
		b = append(b, hexDigit[c>>4], hexDigit[c&15])
	}
	return b
}

const hexDigit = "0123456789abcdef"

// stamp reads a stand-in delta's number and print time from an envelope
// (or any bytes holding its text), or ok false when there is none.
func stamp(b []byte) (k int64, printed int64, ok bool) {
	i := bytes.Index(b, []byte(`"text":"s`))
	if i < 0 {
		return 0, 0, false
	}
	rest := b[i+len(`"text":"s`):]
	k, rest, ok = digits(rest)
	if !ok || len(rest) == 0 || rest[0] != 't' {
		return 0, 0, false
	}
	printed, rest, ok = digits(rest[1:])
	if !ok || len(rest) == 0 || rest[0] != ' ' {
		return 0, 0, false
	}
	return k, printed, true
}

func digits(b []byte) (int64, []byte, bool) {
	var n int64
	i := 0
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		n = n*10 + int64(b[i]-'0')
	}
	return n, b[i:], i > 0
}
