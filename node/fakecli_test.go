package node_test

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

// fakeClaude imitates the claude CLI's stream-json protocol, or
// misbehaves in a chosen way:
//
//	echo     answers each turn with "echo: <text>"; honours interrupts
//	slow     like echo, but streams one word every 100ms
//	hang     answers a turn with a first chunk, then nothing, ever; ignores
//	         stdin EOF, SIGINT and SIGTERM
//	die      starts a turn, complains on stderr and exits 3
//	flood    streams 5000 chunks and one 2 MiB line, then ends the turn
//	garbage  prints lines that are not JSON, then ends the turn
//	chatty   streams 200-byte chunks every 5ms until interrupted
//	orphan   starts a child that sleeps in a session and process group of
//	         its own, as the claude CLI runs a Bash tool (its pid goes to
//	         $SHOAL_FAKE_PIDFILE), then behaves like echo
//	sleep    sleeps (the orphan's child)
//	signals  like echo, but stays up when stdin ends and ignores SIGINT
//	         and SIGTERM; it appends "ready", "eof" and each signal it gets,
//	         with the time in unix nanoseconds, to $SHOAL_FAKE_SIGFILE
//	sigint   like signals, but a SIGINT makes it exit 0 (as the real CLI
//	         does) 300ms later; a signal in between is still recorded
//	stall    like echo, but a turn whose text starts with "stall" sends a
//	         first chunk and then nothing until it is interrupted
//	contract like stall, and a turn whose text starts with "slow" streams a
//	         word every 40ms; what every backend's contract test sends
//	deaf     never reads stdin, and ignores SIGINT and SIGTERM: a CLI that
//	         has stopped reading its input
//	huge     answers each turn with 20 MB of text
//	firehose streams chunks "c1 ", "c2 ", … as fast as it can until
//	         interrupted, writing the number of each to
//	         $SHOAL_FAKE_PRINTED just before it prints it
func fakeClaude(mode string) {
	if len(os.Args) > 1 && os.Args[1] == "--version" {
		fmt.Println("0.0.0 (fake claude, " + mode + ")")
		return
	}
	if len(os.Args) > 2 && os.Args[1] == "auth" && os.Args[2] == "status" {
		fmt.Println(`{"loggedIn": true, "authMethod": "api_key"}`) // as the real CLI answers
		return
	}
	record := func(string) {}
	out := bufio.NewWriter(os.Stdout)
	var mu = make(chan struct{}, 1)
	emit := func(v any) {
		mu <- struct{}{}
		b, _ := json.Marshal(v)
		out.Write(append(b, '\n'))
		out.Flush()
		<-mu
	}
	switch mode {
	case "sleep":
		time.Sleep(time.Hour)
		return
	case "deaf":
		signal.Ignore(syscall.SIGINT, syscall.SIGTERM)
		select {}
	case "hang":
		signal.Ignore(syscall.SIGINT, syscall.SIGTERM)
	case "signals", "sigint":
		record = recorder(os.Getenv("SHOAL_FAKE_SIGFILE"))
		sigs := make(chan os.Signal, 8)
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
		go func() {
			for s := range sigs {
				record(s.String())
				if s == syscall.SIGINT && mode == "sigint" {
					time.AfterFunc(300*time.Millisecond, func() { os.Exit(0) })
				}
			}
		}()
		record("ready")
	case "orphan":
		child := exec.Command(os.Args[0])
		child.Env = append(os.Environ(), "SHOAL_FAKE_CLAUDE=sleep")
		child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := child.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.WriteFile(os.Getenv("SHOAL_FAKE_PIDFILE"), []byte(fmt.Sprint(child.Process.Pid)), 0o600)
	}
	session := "fake-session-1"
	delta := func(text string) {
		emit(map[string]any{"type": "stream_event", "event": map[string]any{"type": "content_block_delta", "index": 0,
			"delta": map[string]any{"type": "text_delta", "text": text}}})
	}
	result := func(stop string, isErr bool, subtype string) {
		emit(map[string]any{"type": "result", "subtype": subtype, "is_error": isErr, "stop_reason": stop, "session_id": session,
			"usage": map[string]any{"input_tokens": 10, "output_tokens": 3, "cache_read_input_tokens": 1, "cache_creation_input_tokens": 0}})
	}
	interrupted := make(chan struct{}, 1)
	turns := make(chan string, 16)
	go func() {
		in := bufio.NewScanner(os.Stdin)
		in.Buffer(make([]byte, 1<<20), 16<<20)
		for in.Scan() {
			var m struct {
				Type      string `json:"type"`
				RequestID string `json:"request_id"`
				Message   struct {
					Content []struct {
						Text string `json:"text"`
					} `json:"content"`
				} `json:"message"`
			}
			json.Unmarshal(in.Bytes(), &m)
			switch m.Type {
			case "user":
				turns <- m.Message.Content[0].Text
			case "control_request":
				emit(map[string]any{"type": "control_response", "response": map[string]any{"subtype": "success", "request_id": m.RequestID}})
				select {
				case interrupted <- struct{}{}:
				default:
				}
			}
		}
		record("eof")
		close(turns)
	}()
	for text := range turns {
		emit(map[string]any{"type": "system", "subtype": "init", "session_id": session})
		emit(map[string]any{"type": "stream_event", "event": map[string]any{"type": "message_start"}})
		switch mode {
		case "hang":
			delta("thinking about ")
			select {}
		case "chatty":
			// Streams until interrupted.
			for {
				select {
				case <-interrupted:
					emit(map[string]any{"type": "user", "message": map[string]any{"content": []any{map[string]any{"type": "text", "text": "[Request interrupted by user]"}}}})
					result("", true, "error_during_execution")
				case <-time.After(5 * time.Millisecond):
					delta(strings.Repeat("chatter ", 25))
					continue
				}
				break
			}
			continue
		case "stall", "contract":
			if strings.HasPrefix(text, "stall") {
				delta("let me think")
				<-interrupted
				emit(map[string]any{"type": "user", "message": map[string]any{"content": []any{map[string]any{"type": "text", "text": "[Request interrupted by user]"}}}})
				result("", true, "error_during_execution")
				continue
			}
		case "die":
			delta("about to ")
			fmt.Fprintln(os.Stderr, "fatal: the fake CLI fell over")
			os.Exit(3)
		case "flood":
			for i := range 5000 {
				delta(fmt.Sprintf("w%d ", i))
			}
			out.Write([]byte(`{"type":"assistant","message":{"content":[{"type":"text","text":"` + strings.Repeat("x", 2<<20) + `"}]}}` + "\n"))
			out.Flush()
		case "image", "bigresult":
			content := any(strings.Repeat("output line\n", 20000))
			if mode == "image" {
				content = []any{map[string]any{"type": "image", "source": map[string]any{"type": "base64", "media_type": "image/png", "data": tallPNG()}}}
			}
			emit(map[string]any{"type": "assistant", "message": map[string]any{"content": []any{map[string]any{"type": "tool_use", "id": "tu1", "name": "Screenshot", "input": map[string]any{}}}}})
			emit(map[string]any{"type": "user", "message": map[string]any{"content": []any{map[string]any{"type": "tool_result", "tool_use_id": "tu1", "content": content}}}})
		case "firehose":
			printed, err := os.OpenFile(os.Getenv("SHOAL_FAKE_PRINTED"), os.O_CREATE|os.O_WRONLY, 0o600)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			for n := 1; ; n++ {
				select {
				case <-interrupted:
					emit(map[string]any{"type": "user", "message": map[string]any{"content": []any{map[string]any{"type": "text", "text": "[Request interrupted by user]"}}}})
					result("", true, "error_during_execution")
				default:
					// Said before it is printed: what the node stores
					// is never past what the file says (a reader of the
					// file after a kill bounds what can be stored).
					printed.WriteAt([]byte(fmt.Sprintf("%-20d", n)), 0)
					delta(fmt.Sprintf("c%d ", n))
					continue
				}
				break
			}
			continue
		case "huge":
			emit(map[string]any{"type": "assistant", "message": map[string]any{"content": []any{map[string]any{"type": "text", "text": strings.Repeat("big answer ", 2<<20)}}}})
			result("end_turn", false, "success")
			continue
		case "garbage":
			fmt.Fprintln(out, "Welcome to the fake CLI!")
			fmt.Fprintln(out, "{half a json")
			fmt.Fprintln(out, "\x1b[31mcolour\x1b[0m")
			out.Flush()
		}
		reply := "echo: " + text
		words := strings.SplitAfter(reply, " ")
		cut := false
		for _, w := range words {
			if mode == "slow" || mode == "contract" && strings.HasPrefix(text, "slow") {
				pause := 100 * time.Millisecond
				if mode == "contract" {
					pause = 40 * time.Millisecond
				}
				select {
				case <-interrupted:
					cut = true
				case <-time.After(pause):
				}
			}
			if cut {
				break
			}
			delta(w)
		}
		if cut {
			emit(map[string]any{"type": "user", "message": map[string]any{"content": []any{map[string]any{"type": "text", "text": "[Request interrupted by user]"}}}})
			result("", true, "error_during_execution")
			continue
		}
		emit(map[string]any{"type": "assistant", "message": map[string]any{"content": []any{map[string]any{"type": "text", "text": reply}}}})
		result("end_turn", false, "success")
	}
	if mode == "halfline" { // cut off mid-write as it is stopped
		mu <- struct{}{}
		out.WriteString(`{"type":"stream_event","event":{"type":"content_blo`)
		out.Flush()
		os.Exit(0)
	}
	if mode == "signals" || mode == "sigint" {
		for { // stdin has ended; only a signal ends this one
			time.Sleep(time.Hour)
		}
	}
}

// recorder returns a function that appends a line "<what> <unix nanos>"
// to path, each with its own write, so a line recorded is on disk even if
// the process is killed right after.
func recorder(path string) func(string) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var mu sync.Mutex
	return func(what string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(f, "%s %d\n", what, time.Now().UnixNano())
	}
}

// tallPNG is an 80×2000 PNG, base64: above the default 1568 long edge.
func tallPNG() string {
	img := image.NewNRGBA(image.Rect(0, 0, 80, 2000))
	for y := range 2000 {
		for x := range 80 {
			img.SetNRGBA(x, y, color.NRGBA{uint8(x), uint8(y), 0, 255})
		}
	}
	var b bytes.Buffer
	png.Encode(&b, img)
	return base64.StdEncoding.EncodeToString(b.Bytes())
}
