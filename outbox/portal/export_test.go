package portal

// Messages is the message catalog, for the external tests.
var Messages = messages

// AcceptLanguage is acceptLanguage, for the external tests.
var AcceptLanguage = acceptLanguage

// Cell is cell, for the external tests.
var Cell = cell
