// Package view holds the pure parts of the leader's live view of the job's
// memory: a rank's figures as a message carries them, the order the view is
// shown in, and the triggers that make the leader take a window before an OOM
// (the thresholds, whether figures cross them, and the reason a trigger window
// carries).
//
// It keeps no state and starts no goroutine: the figures it is given belong to
// the caller.
package view
