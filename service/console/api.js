// Calls to the ovex HTTP API from the console: the key kept in sessionStorage goes in X-API-Key.

const KEY = "ovex.apiKey";

export function getKey() {
  return sessionStorage.getItem(KEY) || "";
}

export function setKey(value) {
  if (value) sessionStorage.setItem(KEY, value);
  else sessionStorage.removeItem(KEY);
}

export class ApiError extends Error {
  constructor(status, detail) {
    super(describe(status, detail));
    this.status = status;
    this.detail = detail;
  }
}

// The server's error body is {"detail": str | [{loc, msg, type}]}: one readable line per field.
function describe(status, detail) {
  let text;
  if (Array.isArray(detail)) {
    text = detail.map((e) => `${(e.loc || []).join(".")}: ${e.msg}`).join("\n");
  } else {
    text = detail ? String(detail) : `HTTP ${status}`;
  }
  if (status === 401 || status === 403) {
    text += "\nEnter the server's API key at the top of the page (`make run` prints it and where it is kept).";
  }
  return text;
}

// The fields an error names, as [{path, name, msg}]: `path` without the leading "body" ("params.dropout"),
// `name` its last part. From a 422's [{loc, msg}] list, from a "field: message" line, or from an Error
// the console raised itself with a `field`.
export function fieldErrors(err) {
  const detail = err && err.detail;
  if (Array.isArray(detail)) {
    return detail.map((e) => {
      const loc = (e.loc || []).filter((p, i) => !(i === 0 && ["body", "query", "path"].includes(p)));
      return { path: loc.join("."), name: String(loc[loc.length - 1] ?? ""), msg: e.msg };
    });
  }
  if (err && err.field) return [{ path: err.field, name: err.field, msg: err.message }];
  const m = typeof detail === "string" ? detail.match(/^((?:body\.)?[A-Za-z_][\w.]*):\s/) : null;
  if (m) {
    const path = m[1].replace(/^body\./, "");
    return [{ path, name: path.split(".").pop(), msg: detail }];
  }
  return [];
}

function headers(extra = {}) {
  const h = { ...extra };
  const key = getKey();
  if (key) h["X-API-Key"] = key;
  return h;
}

export async function api(path, { method = "GET", json } = {}) {
  const init = { method, headers: headers(json === undefined ? {} : { "content-type": "application/json" }) };
  if (json !== undefined) init.body = JSON.stringify(json);
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (err) {
    throw new ApiError(0, `the server cannot be reached (${err.message})`);
  }
  const type = resp.headers.get("content-type") || "";
  const body = type.includes("json") ? await resp.json() : await resp.text();
  if (!resp.ok) throw new ApiError(resp.status, body && body.detail !== undefined ? body.detail : body);
  return body;
}

// Upload with progress: fetch cannot report upload progress, XMLHttpRequest can.
export function upload(path, form, onProgress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", path);
    const key = getKey();
    if (key) xhr.setRequestHeader("X-API-Key", key);
    xhr.responseType = "json";
    xhr.upload.onprogress = (e) => {
      if (e.lengthComputable) onProgress(e.loaded / e.total);
    };
    xhr.onload = () => {
      const body = xhr.response;
      if (xhr.status >= 200 && xhr.status < 300) resolve(body);
      else reject(new ApiError(xhr.status, body && body.detail !== undefined ? body.detail : xhr.statusText));
    };
    xhr.onerror = () => reject(new ApiError(0, "the upload was interrupted (is the server running?)"));
    xhr.send(form);
  });
}
