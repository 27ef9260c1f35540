package main

import (
	"flag"
	"strings"
)

// didYouMean is "; did you mean X?" for the candidates nearest to word,
// each written with prefix, or "" when none is near enough to be what was
// meant.
func didYouMean(word string, candidates []string, prefix string) string {
	near := nearest(word, candidates)
	if len(near) == 0 {
		return ""
	}
	for i, n := range near {
		near[i] = prefix + n
	}
	return "; did you mean " + strings.Join(near, " or ") + "?"
}

// nearest are the candidates at the least edit distance from word, in
// their order, if that distance is small for word's length: one edit for
// up to four letters, two up to eight, three beyond. At most three.
func nearest(word string, candidates []string) []string {
	limit := 1
	switch n := len([]rune(word)); {
	case n > 8:
		limit = 3
	case n > 4:
		limit = 2
	}
	best := limit + 1
	var out []string
	for _, c := range candidates {
		d := editDistance(strings.ToLower(word), strings.ToLower(c))
		switch {
		case d > limit:
			// too far to be what was meant
		case d < best:
			best, out = d, []string{c}
		case d == best:
			out = append(out, c)
		}
	}
	if len(out) > 3 {
		out = out[:3]
	}
	return out
}

// editDistance counts the insertions, deletions, substitutions and swaps
// of two adjacent letters that turn a into b (the optimal string alignment
// distance: "opne" is one swap from "open").
func editDistance(a, b string) int {
	x, y := []rune(a), []rune(b)
	// d[i][j] is the distance between x[:i] and y[:j].
	d := make([][]int, len(x)+1)
	for i := range d {
		d[i] = make([]int, len(y)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(x); i++ {
		for j := 1; j <= len(y); j++ {
			cost := 1
			if x[i-1] == y[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && x[i-1] == y[j-2] && x[i-2] == y[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(x)][len(y)]
}

// otherNames are what other tools call some of shoal's verbs.
var otherNames = map[string]string{"list": "ls", "ps": "ls", "kill": "close", "stop": "close", "logs": "output", "follow": "tail"}

// suggestCommand is "; did you mean X?" for a word that is no command:
// the verb other tools name so, or the nearest verbs.
func suggestCommand(word string) string {
	if verb, ok := otherNames[strings.ToLower(word)]; ok {
		return "; did you mean " + verb + "?"
	}
	return didYouMean(word, commandNames(), "")
}

// commandNames are the verbs shoal knows, help included.
func commandNames() []string {
	var out []string
	for _, c := range commands() {
		out = append(out, c.name)
	}
	return append(out, "help")
}

// visibleFlags are the flags of the command's help: fs's flags but the
// old spellings.
func (c *command) visibleFlags(fs *flag.FlagSet) []string {
	var out []string
	fs.VisitAll(func(f *flag.Flag) {
		if c.renamed(f.Name) == "" {
			out = append(out, f.Name)
		}
	})
	return out
}
