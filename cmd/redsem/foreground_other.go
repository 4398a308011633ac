//go:build unix && !linux

package main

import (
	"os"
	"syscall"
)

// ttyForeground is false here: the command runs in a background group and
// cannot read the terminal (see foreground_linux.go).
func ttyForeground(*os.File) bool { return false }

func foregroundAttr(*syscall.SysProcAttr, *os.File) {}

func takeTerminal(*os.File) {}
