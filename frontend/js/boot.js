// A classic script, not a module: the page runs it while it is parsed, right after the tag of
// its module (/common/app.js). When that module or one it imports cannot be loaded, the page
// says so instead of staying on "Loading…"; the browser's console names the file. A file and
// not an inline handler: the page's Content-Security-Policy runs no inline script.
document.querySelector('script[type="module"][src="/common/app.js"]').addEventListener("error", () => {
  document.getElementById("page").textContent =
    "The page could not load its scripts (/common/app.js or a module it imports): the browser console names the file.";
});
