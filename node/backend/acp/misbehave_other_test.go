//go:build !linux

package acp_test

import "bufio"

// race needs renameat2's exchange, which only Linux has.
func race(*bufio.Scanner, func(any)) string { return "racing needs Linux" }
