// A form generated from a JSON schema (the job `params` of /openapi.json): one labelled control per
// property, its description as the hint, its default as the placeholder. A schema without properties
// (a free-form object) becomes a JSON text area.

export function resolve(schema, root) {
  let s = schema || {};
  for (let i = 0; i < 10 && s.$ref; i++) {
    const path = s.$ref.replace(/^#\//, "").split("/");
    s = path.reduce((node, part) => (node ? node[part] : undefined), root) || {};
  }
  if (!s.properties && Array.isArray(s.allOf) && s.allOf.length === 1) return resolve(s.allOf[0], root);
  if (!s.properties && Array.isArray(s.anyOf)) {
    // an optional object (`X | None`): the member that has properties
    const member = s.anyOf.map((m) => resolve(m, root)).find((m) => m.properties);
    if (member) return member;
  }
  return s;
}

function el(tag, attrs = {}, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== undefined && v !== null) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function kindOf(prop) {
  const types = prop.type ? [prop.type] : (prop.anyOf || []).map((p) => p.type).filter(Boolean);
  if (prop.enum) return "enum";
  if (types.includes("boolean")) return "boolean";
  if (types.includes("integer")) return "integer";
  if (types.includes("number")) return "number";
  return "string";
}

function control(name, prop, id) {
  const kind = kindOf(prop);
  if (kind === "enum") {
    const select = el("select", { id, name });
    select.append(el("option", { value: "" }, `default (${prop.default ?? "none"})`));
    for (const v of prop.enum) select.append(el("option", { value: String(v) }, String(v)));
    return select;
  }
  if (kind === "boolean") {
    const select = el("select", { id, name });
    select.append(el("option", { value: "" }, `default (${prop.default ?? "none"})`));
    select.append(el("option", { value: "true" }, "true"), el("option", { value: "false" }, "false"));
    return select;
  }
  const attrs = { id, name, type: kind === "string" ? "text" : "number", placeholder: prop.default ?? "" };
  if (kind !== "string") {
    attrs.step = kind === "integer" ? "1" : "any";
    if (prop.minimum !== undefined) attrs.min = prop.minimum;
    if (prop.maximum !== undefined) attrs.max = prop.maximum;
  }
  return el("input", attrs);
}

// Build the controls inside `container` (those named in `primary` inside `primaryContainer` instead);
// returns {read(), field(name), showDefaults(values)}: read() yields the params object (only the fields the
// user filled in) or throws an Error naming the field at fault; showDefaults puts the values a blank field
// takes (a base version's, or the schema's with none) in the placeholders.
export function buildForm(container, schema, root, { primary = [], primaryContainer = null } = {}) {
  container.replaceChildren();
  if (primaryContainer) primaryContainer.replaceChildren();
  const s = resolve(schema, root);
  if (!s.properties) {
    const id = "param-json";
    const box = el("div", { class: "field" });
    box.append(el("label", { for: id }, "Options as JSON"));
    const area = el("textarea", { id, rows: "4", placeholder: '{"epochs": 3}' });
    box.append(area);
    container.append(box);
    return {
      field: () => area,
      showDefaults() {},
      read() {
        const text = area.value.trim();
        if (!text) return {};
        try {
          return JSON.parse(text);
        } catch (err) {
          throw new Error(`training options: not valid JSON (${err.message})`);
        }
      },
    };
  }
  const fields = [];
  for (const [name, raw] of Object.entries(s.properties)) {
    const prop = resolve(raw, root);
    const id = `param-${name}`;
    const box = el("div", { class: "field" });
    const label = el("label", { for: id }, prop.title || name);
    const input = control(name, prop, id);
    box.append(label, input);
    if (prop.description) {
      const hint = el("small", { id: `${id}-help`, class: "muted" }, prop.description);
      input.setAttribute("aria-describedby", hint.id);
      box.append(hint);
    }
    (primaryContainer && primary.includes(name) ? primaryContainer : container).append(box);
    fields.push({ name, prop, input });
  }
  return {
    field: (name) => (fields.find((f) => f.name === name) || {}).input || null,
    showDefaults(values = {}) {
      for (const { name, prop, input } of fields) {
        const v = values[name] ?? prop.default;
        const shown = v === null || v === undefined ? "none" : String(v);
        if (input.tagName === "SELECT") input.options[0].textContent = `default (${shown})`;
        else input.placeholder = v === null || v === undefined ? "" : shown;
      }
    },
    read() {
      const out = {};
      for (const { name, prop, input } of fields) {
        const v = input.value.trim();
        if (v === "") continue;
        const kind = kindOf(prop);
        if (kind === "boolean") out[name] = v === "true";
        else if (kind === "integer" || kind === "number") {
          const n = Number(v);
          if (!Number.isFinite(n) || (kind === "integer" && !Number.isInteger(n))) {
            const err = new Error(`${name}: ${v} is not ${kind === "integer" ? "an integer" : "a number"}`);
            err.field = name;
            throw err;
          }
          out[name] = n;
        } else out[name] = v;
      }
      return out;
    },
  };
}
