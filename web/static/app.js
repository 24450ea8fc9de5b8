// Progressive feedback: with JavaScript, YES/REL/NO go to the JSON API without reloading the page.
// Without it, the buttons submit the surrounding form (CSRF-protected) and the page is redrawn.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("feedback-form");
  if (!form || !window.fetch) return;
  form.addEventListener("submit", async (event) => {
    const button = event.submitter;
    if (!button || !button.dataset.label) return;
    event.preventDefault();
    const card = button.closest(".card");
    const state = card.querySelector(".feedback-state");
    const buttons = card.querySelectorAll("button.fb");
    buttons.forEach((b) => { b.disabled = true; });
    try {
      const response = await fetch(form.dataset.api, {
        method: "POST",
        headers: { "Content-Type": "application/json", "Accept": "application/json" },
        body: JSON.stringify({
          subject: form.elements.subject.value,
          description: form.elements.description.value,
          ticket_id: button.dataset.ticketId,
          label: button.dataset.label,
        }),
      });
      const body = await response.json().catch(() => ({}));
      if (!response.ok) throw new Error((body.error && body.error.message) || response.statusText);
      buttons.forEach((b) => {
        const chosen = b === button;
        b.classList.toggle("given", chosen);
        b.setAttribute("aria-pressed", chosen ? "true" : "false");
      });
      state.classList.remove("error");
      state.textContent = "Feedback given: " + button.dataset.label;
    } catch (error) {
      state.classList.add("error");
      state.textContent = "Not saved: " + error.message;
    } finally {
      buttons.forEach((b) => { b.disabled = false; });
    }
  });
});
