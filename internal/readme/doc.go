// Package readme holds the tests that keep the module's Markdown files
// (README.md, the topic pages under docs/, and any other) true to the
// code: every ```go block follows a marker line that says how it is
// checked, and TestSnippets compiles it (or compares it with the copy that
// a test runs); TestLinks checks that every relative link, and every
// #anchor into a Markdown file, resolves. It has no code of its own.
//
// The marker is one of
//
//	<!-- checked -->
//	<!-- checked: ctx context.Context, db *sql.DB -->
//	<!-- checked: runs in outbox/migrations/readme_test.go -->
//
// Without parameters the snippet is a whole file without its package
// clause: imports and declarations. With parameters it is the body of a
// function taking them (the variables it uses without declaring them); it
// may open with an import block, and packages it names without importing
// (context, outbox, ...) are imported for it. With "runs in FILE" it must
// be, line for line, the lines between "// README start" and
// "// README end" in FILE (one tab less), which a test there runs.
//
// Snippets are compiled with go build -overlay as packages of this module,
// so nothing is written into the source tree and imports resolve as a
// user's would; compiler errors name the Markdown file's lines.
package readme
