// Shoal's opencode plugin. Before any of opencode's own tools runs, it asks
// the Shoal node that started this agent whether the agent's policy allows
// the call; a refusal fails the call with the reason. It also appends the
// agent's system prompt, if it has one, to every turn.
const port = process.env.SHOAL_PERMITS_PORT
const token = process.env.SHOAL_PERMITS_TOKEN || ""
const agent = process.env.SHOAL_AGENT_ID || ""
const preset = process.env.SHOAL_AGENT_PERMISSION || "default"
const systemPrompt = process.env.SHOAL_AGENT_SYSTEM_PROMPT || ""
// How long to wait for the node's answer: longer when a person is asked.
const wait = Number(process.env.SHOAL_PERMITS_WAIT_MS) || 5000
const mutating = /^(write|edit|patch|bash|shell|run|delete|move)/i

async function decide(tool, args) {
  if (!port) return { allow: true }
  try {
    const res = await fetch(`http://127.0.0.1:${port}/agent/permission`, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "X-Shoal-Agent-Id": agent,
        "X-Shoal-Permits-Token": token,
      },
      body: JSON.stringify({ tool, args: args ?? {}, preset }),
      signal: AbortSignal.timeout(wait),
    })
    if (!res.ok) throw new Error(`HTTP ${res.status}`)
    return await res.json()
  } catch (err) {
    if (mutating.test(tool)) {
      return { allow: false, why: `the Shoal node is unreachable (${err.message}); refusing a mutating tool` }
    }
    return { allow: true }
  }
}

export const ShoalBridge = async () => ({
  "tool.execute.before": async (input, output) => {
    const d = await decide(input.tool, output.args)
    if (!d.allow) throw new Error(`shoal: ${input.tool} denied (${d.why})`)
    if (d.args && typeof d.args === "object") Object.assign(output.args, d.args)
  },
  "experimental.chat.system.transform": async (_input, output) => {
    if (systemPrompt && Array.isArray(output.system)) output.system.push(systemPrompt)
  },
})
