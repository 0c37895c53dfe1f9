// The playground's request as code: the form's request as a curl command or an openai (Python) call.
// Loaded after app.js, whose helpers ($, state, formRequest, endpoint) it uses.
"use strict";

function updateSnippet() {
  if (!state.caps) return;
  const { fields, files } = formRequest();
  const { path } = endpoint(files);
  $("#snippet").textContent = state.tab === "curl" ? curlSnippet(path, fields, files) : pythonSnippet(fields, files);
  for (const tab of document.querySelectorAll("[data-tab]")) tab.classList.toggle("on", tab.dataset.tab === state.tab);
}

const shellQuote = (text) => `'${String(text).replaceAll("'", "'\\''")}'`;

function curlSnippet(path, fields, files) {
  const lines = [`curl ${location.origin}${path}`];
  if (state.key) lines.push(`-H "Authorization: Bearer $VIDLOOM_API_KEY"`);
  if (Object.keys(files).length) {
    for (const [name, value] of Object.entries(fields)) lines.push(`-F ${shellQuote(`${name}=${value}`)}`);
    for (const [name, file] of Object.entries(files)) lines.push(`-F ${shellQuote(`${name}=@${file.name}`)}`);
  } else {
    lines.push(`-H "Content-Type: application/json"`, `-d ${shellQuote(JSON.stringify(fields))}`);
  }
  return lines.join(" \\\n  ");
}

const pyLiteral = (value) => (typeof value === "boolean" ? (value ? "True" : "False") : JSON.stringify(value));

// The openai package: its own parameters as arguments, vidloom's extensions in extra_body.
function pythonSnippet(fields, files) {
  const own = ["model", "prompt", "size", state.caps.videos ? "seconds" : "response_format"];
  const args = [], extra = {};
  for (const [name, value] of Object.entries(fields)) {
    if (own.includes(name)) args.push(`${name}=${pyLiteral(value)}`);
    else extra[name] = value;
  }
  for (const [name, file] of Object.entries(files)) args.push(`${name}=open(${JSON.stringify(file.name)}, "rb")`);
  const entries = Object.entries(extra).map(([name, value]) => `"${name}": ${pyLiteral(value)}`);
  if (entries.length) args.push(`extra_body={${entries.join(", ")}}`);
  const { call } = endpoint(files);
  const key = state.key ? `os.environ["VIDLOOM_API_KEY"]` : `"unused"`;
  return [`import os`, `from openai import OpenAI`, ``,
    `client = OpenAI(base_url="${location.origin}/v1", api_key=${key})`,
    `result = ${call}(\n    ${args.join(",\n    ")},\n)`, `print(result)`].join("\n");
}
