package render

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/shoalfabric/shoal/schemas"
)

// --- tool input and content summaries ------------------------------------

// summaryKeys are the input fields that best say what a tool call does,
// most telling first.
var summaryKeys = []string{
	"command", "cmd", "file_path", "filePath", "notebook_path", "pattern",
	"path", "url", "uri", "query", "description", "prompt",
}

// hasInput reports whether raw carries tool input: not absent, null or {}.
func hasInput(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	switch {
	case len(t) == 0, string(t) == "null":
		return false
	case t[0] == '{' && t[len(t)-1] == '}' && len(bytes.TrimSpace(t[1:len(t)-1])) == 0:
		return false
	}
	return true
}

// inputSummary picks the most telling field of a tool's input JSON, else
// the input as compact JSON; "" for no input.
func inputSummary(raw json.RawMessage) string {
	if !hasInput(raw) {
		return ""
	}
	var v any
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		return oneLine(string(raw))
	}
	switch x := v.(type) {
	case string:
		return oneLine(x)
	case map[string]any:
		for _, k := range summaryKeys {
			s := scalar(x[k])
			if s == "" {
				continue
			}
			s = oneLine(s)
			if k == "pattern" {
				if dir := scalar(x["path"]); dir != "" {
					s += "  in " + oneLine(dir)
				}
			}
			return s
		}
		if todos, ok := x["todos"].([]any); ok {
			return Plural(len(todos), "todo")
		}
	}
	return oneLine(compactJSON(raw))
}

// scalar renders a JSON value as a word: strings as they are, numbers and
// booleans as written, an array of them shell-quoted and joined (a command
// given as argv); "" for anything else.
func scalar(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case json.Number:
		return x.String()
	case bool:
		return strconv.FormatBool(x)
	case []any:
		words := make([]string, 0, len(x))
		for _, e := range x {
			s, ok := e.(string)
			if !ok {
				return ""
			}
			words = append(words, shellQuote(s))
		}
		return strings.Join(words, " ")
	}
	return ""
}

func shellQuote(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\n'\"\\$`|&;<>()*?[]{}!#~") {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func compactJSON(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return string(raw)
	}
	return b.String()
}

func locationSummary(l schemas.Location) string {
	s := cleanLine(l.Path)
	if l.Line != nil {
		s += ":" + strconv.Itoa(*l.Line)
	}
	return s
}

// contentSummary describes one piece of tool call content on one line.
func contentSummary(tc schemas.ToolCallContent) string {
	switch tc.Type {
	case schemas.ToolContentDiff:
		return "edit " + cleanLine(tc.Path)
	case schemas.ToolContentTerminal:
		return "terminal " + cleanLine(tc.TerminalID)
	case schemas.ToolContentBlock, "":
		if isText(tc.Content) {
			return oneLine(tc.Content.Text)
		}
		return blockSummary(tc.Content)
	}
	return "[" + cleanLine(tc.Type) + "]"
}

// resultLines lists what a tool produced, one entry per non-blank text line
// and per other piece of content; with no content, the raw output.
func resultLines(content []schemas.ToolCallContent, output json.RawMessage) []string {
	var lines []string
	for _, tc := range content {
		switch {
		case (tc.Type == schemas.ToolContentBlock || tc.Type == "") && isText(tc.Content):
			lines = append(lines, textLines(tc.Content.Text)...)
		case tc.Type == schemas.ToolContentBlock && tc.Content.Type == schemas.ContentResource && tc.Content.Text != "":
			lines = append(lines, textLines(tc.Content.Text)...)
		default:
			if s := contentSummary(tc); s != "" {
				lines = append(lines, s)
			}
		}
	}
	if len(content) > 0 || len(output) == 0 {
		return lines
	}
	var s string
	if err := json.Unmarshal(output, &s); err == nil {
		return textLines(s)
	}
	if c := compactJSON(output); c != "" && c != "null" && c != `""` {
		return []string{cleanLine(c)}
	}
	return nil
}

// blockSummary describes a content block on one line: text as its first
// line, anything else as a bracketed placeholder.
func blockSummary(c schemas.ContentBlock) string {
	switch c.Type {
	case schemas.ContentText, "":
		return oneLine(c.Text)
	case schemas.ContentImage, schemas.ContentAudio:
		parts := []string{c.Type}
		if c.MimeType != "" {
			parts = append(parts, cleanLine(c.MimeType)+",")
		}
		switch {
		case c.Data != "":
			parts = append(parts, formatSize(base64Len(c.Data)))
		case c.URI != "":
			parts = append(parts, cleanLine(c.URI))
		}
		return "[" + strings.TrimSuffix(strings.Join(parts, " "), ",") + "]"
	case schemas.ContentResourceLink:
		name := c.Name
		if name == "" {
			name = c.URI
		}
		return "[link " + cleanLine(name) + "]"
	case schemas.ContentResource:
		if c.Text != "" {
			return oneLine(c.Text)
		}
		return "[resource " + cleanLine(c.URI) + "]"
	}
	return "[" + cleanLine(c.Type) + "]"
}

// base64Len is the decoded length of base64 data.
func base64Len(data string) int {
	n := 0
	for i := 0; i < len(data); i++ {
		switch c := data[i]; {
		case c == '=' || c == '\n' || c == '\r' || c == ' ':
		default:
			n++
		}
	}
	return n * 3 / 4
}

func formatSize(n int) string {
	switch {
	case n < 1024:
		return fmt.Sprintf("%d B", n)
	case n < 1024*1024:
		return fmt.Sprintf("%d KiB", (n+512)/1024)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1024*1024))
}

// --- numbers and words -----------------------------------------------------

// groupDigits writes n with thousands separators: 12,345.
func groupDigits(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	return b.String()
}

func formatCost(c float64) string {
	if c < 1 && c > -1 {
		return fmt.Sprintf("$%.4f", c)
	}
	return fmt.Sprintf("$%.2f", c)
}

// Plural is n and word, with an s but for one: "1 commit", "2 files".
func Plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.Itoa(n) + " " + word + "s"
}

func moreLines(n int) string {
	if n == 1 {
		return "(+1 line)"
	}
	return "(+" + strconv.Itoa(n) + " lines)"
}

func containsFold(s, sub string) bool {
	return strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}

// --- sanitising and measuring ---------------------------------------------

// stripControls removes terminal escape sequences and control characters
// other than newline from s, turns tabs into spaces and invalid UTF-8 into
// U+FFFD, so a summary can neither restyle the terminal nor move its cursor.
func stripControls(s string) string { return strip(s, false) }

// Clean is text an agent, a model or a node wrote, made safe to print on
// a terminal: its escape sequences and control characters other than
// newline and tab removed (C1 controls and bidirectional overrides too),
// invalid UTF-8 made U+FFFD. Such text could otherwise retitle the
// terminal, clear or forge the screen, plant links or write the
// clipboard.
func Clean(s string) string { return strip(s, true) }

// OneLine is s cleaned (Clean) and its whitespace, line breaks included,
// made single spaces: for a status or an error line that quotes what a
// node, an agent or a model said.
func OneLine(s string) string { return strings.Join(strings.Fields(Clean(s)), " ") }

// Cell is s cleaned (Clean) for a cell of a table, with its tabs and
// line breaks written as \t and \n: a model's name, a path or a node's
// label holding them would otherwise end its row or cell early and
// forge others under it.
func Cell(s string) string {
	s = Clean(s)
	if !strings.ContainsAny(s, "\t\n") {
		return s
	}
	return strings.NewReplacer("\t", `\t`, "\n", `\n`).Replace(s)
}

func strip(s string, keepTabs bool) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 0x20 && c != '\n' && (c != '\t' || !keepTabs)) || c == 0x7f || c >= 0x80 {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == 0x1b:
			i += escapeLen(s[i:])
			continue
		case r == '\t' && keepTabs:
			b.WriteByte('\t')
		case r == '\t':
			b.WriteByte(' ')
		case r == '\n':
			b.WriteByte('\n')
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || bidiControl(r):
		default:
			b.WriteRune(r)
		}
		i += n
	}
	return b.String()
}

// bidiControl is a bidirectional embedding, override or isolate: text
// after it is shown reordered, so what a terminal shows is not what is
// there (U+202A–U+202E, U+2066–U+2069).
func bidiControl(r rune) bool { return (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) }

// escapeLen is the length of the escape sequence at the start of s: CSI
// (ESC [ … final byte), OSC and other strings (ESC ] … BEL or ST), or ESC
// and one character.
func escapeLen(s string) int {
	if len(s) < 2 {
		return len(s)
	}
	switch s[1] {
	case '[':
		for i := 2; i < len(s); i++ {
			if c := s[i]; c >= 0x40 && c <= 0x7e {
				return i + 1
			}
		}
		return len(s)
	case ']', 'P', '_', '^', 'X':
		for i := 2; i < len(s); i++ {
			if s[i] == 0x07 {
				return i + 1
			}
			if s[i] == 0x1b && i+1 < len(s) && s[i+1] == '\\' {
				return i + 2
			}
		}
		return len(s)
	}
	return 2
}

// cleanStream removes control characters from streamed text, keeping
// newlines and tabs. It works on bytes, so a chunk may end inside a rune.
func cleanStream(s string) string {
	drop := func(i int) int {
		switch c := s[i]; {
		case c == '\n' || c == '\t':
			return 0
		case c < 0x20 || c == 0x7f:
			return 1
		case c == 0xc2 && i+1 < len(s) && s[i+1] >= 0x80 && s[i+1] < 0xa0:
			return 2 // a C1 control
		case c == 0xe2 && i+2 < len(s) && ((s[i+1] == 0x80 && s[i+2] >= 0xaa && s[i+2] <= 0xae) || (s[i+1] == 0x81 && s[i+2] >= 0xa6 && s[i+2] <= 0xa9)):
			return 3 // a bidirectional override or isolate
		}
		return 0
	}
	i := 0
	for i < len(s) && drop(i) == 0 {
		i++
	}
	if i == len(s) {
		return s
	}
	b := []byte(s[:i])
	for i < len(s) {
		if n := drop(i); n > 0 {
			i += n
			continue
		}
		b = append(b, s[i])
		i++
	}
	return string(b)
}

// textLines splits s into its non-blank lines, cleaned and right-trimmed.
func textLines(s string) []string {
	var lines []string
	for l := range strings.SplitSeq(stripControls(s), "\n") {
		if l = strings.TrimRightFunc(l, unicode.IsSpace); strings.TrimSpace(l) != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// oneLine is the first non-blank line of s, trimmed, with " …" when more
// lines follow.
func oneLine(s string) string {
	lines := textLines(s)
	switch len(lines) {
	case 0:
		return ""
	case 1:
		return strings.TrimSpace(lines[0])
	}
	return strings.TrimSpace(lines[0]) + " …"
}

// cleanLine is s cleaned, with its line breaks as spaces.
func cleanLine(s string) string {
	return strings.TrimSpace(strings.ReplaceAll(stripControls(s), "\n", " "))
}

// width is the number of terminal columns s takes, counting wide (East
// Asian, emoji) runes as two and combining marks as none.
func width(s string) int {
	w := 0
	for _, r := range s {
		w += runeWidth(r)
	}
	return w
}

func runeWidth(r rune) int {
	switch {
	case r == 0x200b || r == 0x200d || r == 0xfe0f || unicode.Is(unicode.Mn, r):
		return 0
	case r >= 0x1100 && r <= 0x115f, r >= 0x2e80 && r <= 0xa4cf && r != 0x303f,
		r >= 0xac00 && r <= 0xd7a3, r >= 0xf900 && r <= 0xfaff,
		r >= 0xfe30 && r <= 0xfe4f, r >= 0xff00 && r <= 0xff60,
		r >= 0xffe0 && r <= 0xffe6, r >= 0x1f300 && r <= 0x1f64f,
		r >= 0x1f900 && r <= 0x1f9ff, r >= 0x20000 && r <= 0x3fffd:
		return 2
	}
	return 1
}

// truncate shortens s to at most max columns, ending it with "…" when cut.
func truncate(s string, max int) string {
	if width(s) <= max {
		return s
	}
	if max <= 0 {
		return ""
	}
	w := 0
	for i, r := range s {
		rw := runeWidth(r)
		if w+rw > max-1 {
			return strings.TrimRightFunc(s[:i], unicode.IsSpace) + "…"
		}
		w += rw
	}
	return s
}

// CleanAll cleans (Clean) every string v points to: in its fields, its
// slices' and maps' elements, its maps' keys and what its pointers point
// to, in place; bytes (raw JSON) and interfaces are left as they are.
// For records a node or an agent wrote (agents, nodes, permission
// requests, usage) before they are shown on a terminal.
func CleanAll(v any) {
	cleanValue(reflect.ValueOf(v))
}

func cleanValue(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			cleanValue(v.Elem())
		}
	case reflect.String:
		if v.CanSet() {
			if c := Clean(v.String()); c != v.String() {
				v.SetString(c)
			}
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				cleanValue(v.Field(i))
			}
		}
	case reflect.Slice, reflect.Array:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return
		}
		for i := range v.Len() {
			cleanValue(v.Index(i))
		}
	case reflect.Map:
		if v.IsNil() || !v.CanSet() {
			return
		}
		clean := reflect.MakeMapWithSize(v.Type(), v.Len())
		for it := v.MapRange(); it.Next(); {
			k := reflect.New(v.Type().Key()).Elem()
			k.Set(it.Key())
			cleanValue(k)
			e := reflect.New(v.Type().Elem()).Elem()
			e.Set(it.Value())
			cleanValue(e)
			clean.SetMapIndex(k, e)
		}
		v.Set(clean)
	}
}

// CleanWriter writes to w what it is given, Clean: for a verb's lines and
// tables, which show what agents, models and nodes wrote.
func CleanWriter(w io.Writer) io.Writer { return cleanWriter{w} }

type cleanWriter struct{ w io.Writer }

func (c cleanWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(c.w, Clean(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}
