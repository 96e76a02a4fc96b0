// Package layout holds a test of the project's shape: the top-level folders'
// packages import one another without a cycle (internal/ and merge/ once did,
// through a helper package).
package layout
