//go:build linux

package main

import (
	"os"
	"os/signal"
	"syscall"
	"unsafe"
)

// ttyForeground reports whether f is redsem's controlling terminal with
// redsem's process group in its foreground: run then hands the terminal to
// the command's group while it runs, so that the command reads it as under
// flock(1) instead of stopping on SIGTTIN.
func ttyForeground(f *os.File) bool {
	var pgrp int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TIOCGPGRP, uintptr(unsafe.Pointer(&pgrp))); e != 0 {
		return false // not a terminal, or not ours
	}
	return int(pgrp) == syscall.Getpgrp()
}

// foregroundAttr makes the command's group the foreground group of the
// terminal f as it starts.
func foregroundAttr(attr *syscall.SysProcAttr, f *os.File) {
	attr.Foreground, attr.Ctty = true, int(f.Fd())
}

// takeTerminal gives the terminal f back to redsem's process group once the
// command is done. From a background group that takes ignoring SIGTTOU,
// which would otherwise stop redsem.
func takeTerminal(f *os.File) {
	signal.Ignore(syscall.SIGTTOU)
	defer signal.Reset(syscall.SIGTTOU)
	pgrp := int32(syscall.Getpgrp())
	_, _, _ = syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TIOCSPGRP, uintptr(unsafe.Pointer(&pgrp)))
}
